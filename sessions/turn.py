"""The turn: a user's message in, exactly one reply out, with one transaction that writes.

Runs while the gateway holds the user's turn lock, so a user's turns never interleave::

    read   route the message to its session and read the context: the session row, the
           messages since its last compaction (cached between turns and checked against the
           row), the organization and the user's memory (cached), recall passages. Reads
           alone when the session continues as it stands (autocommit on PostgreSQL, no lock
           on SQLite); in a transaction when routing creates, archives or reactivates one
    model  (no transaction) compaction first when due (PreCompact archive, then summary),
           then the model, with its tool rounds
    write  (one transaction, `sessions.turn_write`) the user's message and everything the
           turn produced, the session's counters and usage, the channel it came through,
           the reply in the outbox and the inbound event finished: all or nothing
    after  the transcript segment and, every few messages, the topic

Nothing of the turn is stored before its answer is: a crash (or a model failure that the
retries do not cure) before the write leaves the event pending and the session as it was, so
the next attempt starts from the beginning with nothing to undo. A model failure that
outlasts the retries is answered with an apology in the same write, the user's message kept.

A tool call waiting for the user's yes (`tool_confirmations`) is read with the context and
answered by this message (`sessions.turn_tools`): the write removes it, and stores the one this turn
asks about, if any, with the tools the turn used (`skills_activated`).

The gateway hands in a `UserTurn` (plain values: no channel payload, an opaque reply context)
and gets back a `TurnResult`; it sends the committed reply and then calls `after_reply`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import datetime, timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from errors import LLMError, StorageError
from sessions.compaction import transcript_line
from sessions.context import HistoryMessage
from sessions.engine import SessionEngine
from sessions.engine_values import ConfirmedCall, ContextReads, NewMessage, TurnOutcome
from sessions.files.turn_files import FileIntake, TurnFiles, message_blocks
from sessions.llm import estimate_tokens
from sessions.progress import NO_PROGRESS, TurnProgress
from sessions.routing import (
    Route,
    RoutingPolicy,
    find_unchanged,
    resolve_session,
    route_current,
)
from sessions.turn_tools import WaitingCalls
from sessions.turn_values import LLM_APOLOGY_TEXT, TurnResult, UserTurn, new_outbound_id
from sessions.turn_write import TurnReply, messages_to_store, write_turn
from storage.database import Database
from storage.repositories.tool_confirmations import WaitingCall
from storage.transcripts import SessionRef, TranscriptStore

log = structlog.stdlib.get_logger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class _TurnReads:
    """What a turn reads with its route: the context but recall, the user's message (the
    history's last), and the tool call waiting for a yes with what the message says to it."""

    context: ContextReads
    pending: HistoryMessage
    waiting: WaitingCall | None
    confirmed: ConfirmedCall | None


class TurnService:
    """Answers users' messages: routing, context, model, storage, transcript, topic."""

    def __init__(
        self,
        database: Database,
        engine: SessionEngine,
        transcripts: TranscriptStore,
        routing: RoutingPolicy,
        *,
        clock: Callable[[], datetime],
        reply_lease: timedelta,
        find_referenced: Callable[[str, str], Awaitable[str | None]] | None = None,
        waiting: Callable[[], AbstractAsyncContextManager[None]] = nullcontext,
        mirroring: Callable[[], AbstractAsyncContextManager[None]] = nullcontext,
        files: FileIntake | None = None,
    ) -> None:
        self.database = database
        # Stores and reads the files that come with messages (None: their names only).
        self.files = files
        self.engine = engine
        self.transcripts = transcripts
        self.routing = routing
        self.clock = clock
        # Replies are committed already claimed by this process for `reply_lease`, to be sent
        # at once; if the process dies first, the lease runs out and any outbox sends them.
        self.reply_lease = reply_lease
        # (user id, text) → an archived session the text clearly continues.
        self.find_referenced = find_referenced
        # Wraps storing and reading a turn's files (the gateway gives its work slot up there).
        self.waiting = waiting
        # Wraps the wait for the transcript's segment after the reply (the gateway gives up
        # its work slot and its place among the turns at once: a slow store must not keep
        # other users' turns from starting).
        self.mirroring = mirroring
        # Tool calls waiting for the user's yes: read, answered, asked for.
        self.calls = WaitingCalls()

    async def answer(self, turn: UserTurn, progress: TurnProgress = NO_PROGRESS) -> TurnResult:
        """Answer the turn and commit everything it produced; raises `TurnSupersededError`
        when the event was finished elsewhere and `GatewayError`s of storage for a retry.

        `progress` sees the turn as it runs (status, the answer's text as the model writes
        it); before the write it settles, and the live message it names, if any, goes into
        the reply's context for the sender to finish: the streamed message is the reply.
        """
        arrival = turn.arrival
        now = self.clock()
        route, read = await self._route_and_read(turn, now=now)
        reads, pending = read.context, read.pending
        waiting, confirmed = read.waiting, read.confirmed
        session_id, org_id = route.session.id, route.session.org_id
        structlog.contextvars.bind_contextvars(session_id=session_id)
        # Recall searches after the reads, in transactions of its own.
        reads = await self.engine.with_earlier(reads)
        taken = await self._take_files(
            turn, SessionRef(org_id, arrival.user_id, session_id), progress
        )
        if taken is not None:
            pending = _with_files(pending, turn.text, taken)
            reads = dataclasses.replace(reads, history=(*reads.history[:-1], pending))
        loaded = self.engine.context_from(reads)
        log.info("turn.started", route=route.reason)
        started = time.perf_counter()
        outcome: TurnOutcome | None = None
        failure = None
        try:
            outcome = await self.engine.reply(
                loaded,
                thread_id=arrival.thread_id,
                pending=pending,
                progress=progress,
                confirmed=confirmed,
            )
        except LLMError as exc:
            log.error("llm.failed", error=str(exc))
            failure = str(exc)
        model_seconds = time.perf_counter() - started
        live = await progress.settle()
        produced: tuple[NewMessage, ...] = outcome.messages if outcome else ()
        reply_text = outcome.reply_text if outcome else LLM_APOLOGY_TEXT
        if taken is not None and taken.problems:
            reply_text = f"{reply_text}\n\n" + " ".join(taken.problems)
        reply_id = new_outbound_id()
        to_store = messages_to_store(turn, pending.content, taken, produced, reply_id)
        reply = TurnReply(reply_text, reply_id, outcome, failure, live)
        now = self.clock()
        # A tool turn's records are ORM writes and need a session; a plain turn's write is
        # driver statements only (on PostgreSQL a lent connection, no session, committed by
        # its pipeline's end).
        scope = (
            self.database.session()
            if self.calls.records(confirmed, outcome)
            else self.database.driver_atomic()
        )
        async with scope as db:
            if isinstance(db, AsyncSession):
                # The ORM's writes first, then the turn's own, driver statements in one
                # pipeline (`sessions.turn_write`).
                await self.calls.record(
                    db, session_id, arrival.user_id, confirmed, outcome, now=now
                )
            first_seq, outbound = await write_turn(
                db, turn, route, to_store, reply, at=now, reply_lease=self.reply_lease
            )
        last_seq = first_seq + len(to_store) - 1
        # Nothing waits for a yes after this turn when none waited (or it answered the one
        # that did) and it asked none.
        self.calls.remember(
            session_id,
            last_seq,
            none_waiting=(waiting is None or confirmed is not None)
            and outcome is not None
            and outcome.confirmation is None,
        )
        stored = [
            HistoryMessage(
                seq=first_seq + position,
                role=message.role,
                content=message.content,
                tokens=message.tokens,
                thread_id=message.thread_id,
                blocks=tuple(message.metadata.get("blocks", ())),
            )
            for position, message in enumerate(to_store)
        ]
        self.engine.histories.extend(session_id, after_seq=first_seq - 1, messages=stored)
        log.info(
            "turn.answered",
            seq=last_seq,
            input_tokens=outcome.input_tokens if outcome else 0,
            output_tokens=outcome.output_tokens if outcome else 0,
            compacted=outcome.compacted if outcome else False,
        )
        return TurnResult(
            session_id=session_id,
            org_id=org_id,
            user_id=arrival.user_id,
            first_seq=first_seq,
            last_seq=last_seq,
            reply_text=reply_text,
            outbound=outbound,
            answered=outcome is not None,
            compacted=outcome.compacted if outcome else False,
            input_tokens=outcome.input_tokens if outcome else 0,
            output_tokens=outcome.output_tokens if outcome else 0,
            model_seconds=model_seconds,
            transcript=tuple(
                transcript_line(
                    seq=first_seq + position,
                    message_id=message.message_id,
                    role=message.role,
                    channel=message.channel_type,
                    thread_id=message.thread_id,
                    content=message.content,
                    metadata=message.metadata,
                    at=now,
                    tokens=message.tokens,
                )
                for position, message in enumerate(to_store)
            ),
        )

    async def _route_and_read(self, turn: UserTurn, *, now: datetime) -> tuple[Route, _TurnReads]:
        """The turn's session and what it reads with it.

        Most messages continue a session as it stands: routed and read without a transaction
        (PostgreSQL) or a write lock (SQLite), by the current sessions the dispatcher read
        with the queue when the message names no thread and answers nothing. Routing that
        changes something (a session created, archived or reactivated) runs in one, with the
        reads.
        """
        arrival = turn.arrival
        found = None
        if turn.current is not None:
            found = route_current(arrival, self.routing, turn.current, now=now)
        async with self.database.lookups() as db:
            if found is None:
                found = await find_unchanged(db, arrival, self.routing, now=now)
            if isinstance(found, Route):
                return found, await self._read(db, found, turn, now=now)
        referenced = None
        if (
            self.find_referenced is not None
            and turn.may_resume_by_reference
            and not arrival.thread_id
            and not arrival.references
        ):
            # Searched before the routing transaction: on SQLite a second transaction inside
            # it would wait for its write lock.
            referenced = await self.find_referenced(arrival.user_id, turn.text)
        async with self.database.session() as db:
            route = await resolve_session(
                db, arrival, self.routing, now=now, referenced=referenced, unrouted=found
            )
            return route, await self._read(db, route, turn, now=now)

    async def _read(
        self, db: AsyncSession, route: Route, turn: UserTurn, *, now: datetime
    ) -> _TurnReads:
        """What the turn reads with its route (see `_TurnReads`)."""
        session = route.session
        pending = HistoryMessage(
            seq=session.last_seq + 1,
            role="user",
            content=turn.text,
            tokens=estimate_tokens(turn.text),
            thread_id=turn.arrival.thread_id,
        )
        reads = await self.engine.read_context(
            db, session, thread_id=turn.arrival.thread_id, pending=pending
        )
        waiting, confirmed = await self.calls.read(
            db, session.id, session.last_seq, turn.arrival.user_id, turn.text, now=now
        )
        return _TurnReads(reads, pending, waiting, confirmed)

    async def after_reply(self, result: TurnResult) -> str | None:
        """The work that follows a sent reply: the transcript segment, then the topic; the
        session's new topic when this turn wrote one."""
        # The database is the record; the transcript is its mirror for archives and exports,
        # rebuilt from the database at PreCompact time, so a failure here only logs.
        try:
            async with self.mirroring():
                await self.transcripts.append_lines(
                    SessionRef(result.org_id, result.user_id, result.session_id),
                    list(result.transcript),
                    first_seq=result.first_seq,
                )
        except StorageError as exc:
            log.warning("transcript.append_failed", error=str(exc))
        if not result.answered:
            return None
        try:
            return await self.engine.topics.update_if_due(
                result.session_id, first_seq=result.first_seq, last_seq=result.last_seq
            )
        except LLMError as exc:
            log.warning("session.topic_failed", error=str(exc))
            return None

    async def _take_files(
        self, turn: UserTurn, ref: SessionRef, progress: TurnProgress
    ) -> TurnFiles | None:
        """The turn's files stored under its session and read (None: it brought none)."""
        if not turn.files or self.files is None:
            return None
        async with self.waiting():  # storing and reading files are waits, not work
            return await self.files.take(ref, turn.files, progress)


def _with_files(pending: HistoryMessage, text: str, files: TurnFiles) -> HistoryMessage:
    """The pending user message with its files: stored as text, shown to the model in this
    turn as blocks (PDF pages and images natively)."""
    stored = "\n\n".join(part for part in (text, files.text) if part)
    return dataclasses.replace(
        pending,
        content=stored,
        tokens=estimate_tokens(stored) + files.native_tokens,
        blocks=message_blocks(files, text),
    )
