"""One turn: an inbound event becomes a transcript entry, a model call and exactly one reply.

Runs while the dispatcher holds the user's turn lock, so a user's turns never interleave. The
turn is split so that a crash at any point is recoverable without duplicates:

1. route the message and append it to the session (commit; the event remembers its `seq`);
2. call the model with the session's context (no transaction open);
3. append the answer, commit the reply to the outbox and finish the event, in one commit.

A restart repeats only what did not commit: step 1 is skipped when the event has a `seq`.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from channels.base import ChannelMessage, FileToSend
from errors import LLMError, StorageError
from gateway.commands import Command, CommandContext, parse_command, run_command
from gateway.identity import ResolvedUser
from gateway.log import bind_turn_context, clear_turn_context, get_logger
from gateway.metrics import GatewayMetrics
from gateway.outbox import ATTACHMENT_KEY
from gateway.router import RoutingPolicy, resolve_session
from gateway.work_slots import WorkSlots
from sessions.engine import SessionEngine
from sessions.llm import estimate_tokens
from storage.database import Database
from storage.models import InboundEvent, InboundStatus, SessionMessage
from storage.models import OutboundMessage as OutboundRow
from storage.repositories import (
    InboxRepository,
    OutboxRepository,
    SessionRepository,
)
from storage.transcripts import SessionRef, TranscriptLine, TranscriptStore

log = get_logger(__name__)

UNKNOWN_SENDER_TEXT = (
    "Hello! You are not enabled to use this assistant yet. "
    "Please ask your administrator to add you."
)
LLM_APOLOGY_TEXT = (
    "Sorry, I could not get an answer from the assistant just now. "
    "Your message is saved; please try again in a moment."
)
FAILURE_APOLOGY_TEXT = (
    "Sorry, something went wrong while handling your message. The team has been notified."
)
REJECTION_INTERVAL = timedelta(hours=1)
MAX_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class TurnSettings:
    """The config values a turn depends on."""

    routing: RoutingPolicy
    history_budget_tokens: int
    # Channels whose clients fetch their replies (the web feed): no send step, no outbox pass.
    pull_channels: frozenset[str] = frozenset()
    # Base of links sent to users (exports); empty for links relative to this server.
    public_url: str = ""


def new_outbound_id() -> str:
    """Our own id for a reply."""
    return f"out-{uuid.uuid4().hex}"


class TurnProcessor:
    """Answers inbound events, one at a time, for a user whose turn lock is held."""

    def __init__(
        self,
        database: Database,
        transcripts: TranscriptStore,
        engine: SessionEngine,
        metrics: GatewayMetrics,
        settings: TurnSettings,
        *,
        clock: Callable[[], datetime],
        send_reply: Callable[[OutboundRow], None],
        reply_lease: timedelta,
        work_slots: WorkSlots,
        find_referenced: Callable[[str, str], Awaitable[str | None]] | None = None,
    ) -> None:
        self.database = database
        # (user id, text) → an archived session the text clearly continues (resume by reference)
        self.find_referenced = find_referenced
        self.transcripts = transcripts
        self.engine = engine
        # Turns wait for the model concurrently but work (read and write the database, build
        # the context) a few at a time; the pool is sized for it (`GatewayRuntime.start`).
        self.work_slots = work_slots
        self.metrics = metrics
        self.settings = settings
        self.clock = clock
        # Replies are committed already claimed by this process for `reply_lease` and handed
        # to `send_reply` once committed: sent at once, without the outbox claiming them; if
        # this process dies first, the lease runs out and any process's outbox sends them.
        self.send_reply = send_reply
        self.reply_lease = reply_lease

    async def process(self, event: InboundEvent, user: ResolvedUser) -> bool:
        """Answer one event; failures are retried up to three times, then apologised for.

        True when the event is finished; False when it failed and stays first in the user's
        queue for another attempt (nothing after it may be answered before it).
        """
        message = ChannelMessage.from_record(event.message)
        bind_turn_context(user_id=user.user_id, channel=message.channel_type.value)
        started = time.perf_counter()
        try:
            async with self.work_slots.working():
                try:
                    await self._answer(event, message, user)
                except Exception as exc:  # noqa: BLE001
                    # The boundary of one unit of work: whatever a turn fails with (a bug
                    # included) is logged with its traceback and counted; after MAX_ATTEMPTS the
                    # user gets an apology and the queue moves on, so one poisoned message can
                    # never wedge a user's queue.
                    return await self._record_failure(event, message, user, exc)
                return True
        finally:
            clear_turn_context()
            self.metrics.turn_latency.observe(time.perf_counter() - started)

    async def reject_unknown_sender(self, event: InboundEvent) -> None:
        """Refuse an event from a sender with no user: one polite message per hour at most."""
        message = ChannelMessage.from_record(event.message)
        channel = message.channel_type.value
        now = self.clock()
        async with self.database.session() as db:
            if not await InboxRepository(db).finish(
                event.id, InboundStatus.REJECTED, at=now, error="unknown sender"
            ):
                return  # another worker handled it
            outbox = OutboxRepository(db)
            recently = await outbox.sent_since(
                channel, message.channel_id, "rejection", now - REJECTION_INTERVAL
            )
            reply = None
            if not recently:
                reply = await self._enqueue(
                    db, message, UNKNOWN_SENDER_TEXT, event_id=event.id, kind="rejection"
                )
        self.metrics.messages_rejected.labels(channel, "unknown_sender").inc()
        log.warning(
            "identity.unknown_sender",
            channel=channel,
            sender=message.user_identifier,
            tenant=message.tenant,
            message_id=message.message_id,
            notified=not recently,
        )
        self._send(reply)

    async def _answer(
        self, event: InboundEvent, message: ChannelMessage, user: ResolvedUser
    ) -> None:
        command = parse_command(message)
        if command is not None and event.appended_seq is None:
            await self._run_command(event, message, user, command)
            return
        session_id, org_id = await self._append_user_message(event, message, user)
        bind_turn_context(session_id=session_id)
        started = time.perf_counter()
        try:
            outcome = await self.engine.run_turn(session_id, thread_id=message.thread_id)
        except LLMError as exc:
            log.error("llm.failed", error=str(exc))
            await self._finish_with(
                event,
                message,
                user,
                LLM_APOLOGY_TEXT,
                session_id=session_id,
                status=InboundStatus.FAILED,
                error=str(exc),
            )
            return
        finally:
            self.metrics.llm_latency.labels(self.engine.llm.name).observe(
                time.perf_counter() - started
            )
        now = self.clock()
        reply_id = new_outbound_id()
        async with self.database.session() as db:
            sessions = SessionRepository(db)
            stored = []
            for position, produced in enumerate(outcome.messages):
                is_reply = position == len(outcome.messages) - 1
                stored.append(
                    await sessions.append_message(
                        session_id,
                        role=produced.role,
                        channel_type=message.channel_type.value,
                        thread_id=message.thread_id,
                        content=produced.content,
                        message_id=reply_id if is_reply else None,
                        in_reply_to=message.message_id if is_reply else None,
                        tokens=produced.tokens,
                        at=now,
                        # Tool calls and results are kept block by block, to be resent exactly.
                        metadata={"blocks": list(produced.blocks)}
                        if any(block.get("type") != "text" for block in produced.blocks)
                        else None,
                    )
                )
            await sessions.add_usage(
                session_id,
                input_tokens=outcome.input_tokens,
                output_tokens=outcome.output_tokens,
                context_tokens=outcome.context_tokens,
            )
            reply = await self._enqueue(
                db,
                message,
                outcome.reply_text,
                event_id=event.id,
                user_id=user.user_id,
                session_id=session_id,
                outbound_id=reply_id,
            )
            await InboxRepository(db).finish(event.id, InboundStatus.DONE, at=now)
        provider = self.engine.llm.name
        self.metrics.llm_tokens.labels(provider, "input").inc(outcome.input_tokens)
        self.metrics.llm_tokens.labels(provider, "output").inc(outcome.output_tokens)
        if outcome.compacted:
            self.metrics.compactions.inc()
        log.info(
            "turn.answered",
            seq=stored[-1].seq,
            input_tokens=outcome.input_tokens,
            output_tokens=outcome.output_tokens,
            compacted=outcome.compacted,
        )
        self._send(reply)
        user_line = _line(
            message.message_id,
            "user",
            message,
            content=message.prompt_text(),
            at=now,
            tokens=estimate_tokens(message.prompt_text()),
        )
        await self._append_transcript(
            SessionRef(org_id, user.user_id, session_id),
            [user_line, *(_stored_line(row, message) for row in stored)],
        )
        try:
            await self.engine.update_topic_if_due(
                session_id, seq_before=stored[0].seq - 2, seq_after=stored[-1].seq
            )
        except LLMError as exc:
            log.warning("session.topic_failed", error=str(exc))

    async def _append_user_message(
        self, event: InboundEvent, message: ChannelMessage, user: ResolvedUser
    ) -> tuple[str, str]:
        if event.appended_seq is not None and event.session_id is not None:
            return event.session_id, user.org_id  # step 1 committed before a restart
        referenced = None
        if self.find_referenced is not None and not message.thread_id and not message.references:
            # Searched before the routing transaction: on SQLite a second transaction inside
            # it would wait for its write lock.
            referenced = await self.find_referenced(user.user_id, message.prompt_text())
        now = self.clock()
        async with self.database.session() as db:
            route = await resolve_session(
                db, user, message, self.settings.routing, now=now, referenced=referenced
            )
            sessions = SessionRepository(db)
            text = message.prompt_text()
            appended = await sessions.append_message(
                route.session.id,
                role="user",
                channel_type=message.channel_type.value,
                thread_id=message.thread_id,
                content=text,
                message_id=message.message_id,
                tokens=estimate_tokens(text),
                at=now,
                metadata=_message_metadata(message),
            )
            await sessions.record_channel(
                route.session.id,
                message.channel_type.value,
                message.channel_id,
                "" if route.thread_taken else message.thread_id,
                at=now,
            )
            if not await InboxRepository(db).mark_appended(
                event.id, seq=appended.seq, session_id=route.session.id, user_id=user.user_id
            ):
                raise StorageError("inbound event vanished during its turn", key=str(event.id))
        event.appended_seq, event.session_id = appended.seq, route.session.id
        log.info("turn.started", session_id=route.session.id, route=route.reason, seq=appended.seq)
        return route.session.id, route.session.org_id

    async def _run_command(
        self, event: InboundEvent, message: ChannelMessage, user: ResolvedUser, command: Command
    ) -> None:
        now = self.clock()
        async with self.database.session() as db:
            outcome = await run_command(
                command,
                CommandContext(
                    db=db,
                    user=user,
                    message=message,
                    policy=self.settings.routing,
                    history_budget_tokens=self.settings.history_budget_tokens,
                    now=now,
                    transcripts=self.transcripts,
                    public_url=self.settings.public_url,
                ),
            )
            reply = await self._enqueue(
                db,
                message,
                outcome.reply,
                event_id=event.id,
                user_id=user.user_id,
                session_id=outcome.session_id,
                kind="command",
                file=outcome.file,
            )
            await InboxRepository(db).finish(event.id, InboundStatus.DONE, at=now)
        self._send(reply)

    async def _finish_with(
        self,
        event: InboundEvent,
        message: ChannelMessage,
        user: ResolvedUser,
        text: str,
        *,
        session_id: str | None,
        status: InboundStatus,
        error: str,
    ) -> None:
        async with self.database.session() as db:
            finished = await InboxRepository(db).finish(
                event.id, status, at=self.clock(), error=error
            )
            reply = None
            if finished:
                reply = await self._enqueue(
                    db,
                    message,
                    text,
                    event_id=event.id,
                    user_id=user.user_id,
                    session_id=session_id,
                    kind="notice",
                )
        self._send(reply)

    async def _record_failure(
        self, event: InboundEvent, message: ChannelMessage, user: ResolvedUser, exc: Exception
    ) -> bool:
        log.exception("turn.failed", event_id=event.id, error=str(exc))
        async with self.database.session() as db:
            attempts = await InboxRepository(db).record_failure(event.id, str(exc)[:2000])
        if attempts < MAX_ATTEMPTS:
            return False
        await self._finish_with(
            event,
            message,
            user,
            FAILURE_APOLOGY_TEXT,
            session_id=event.session_id,
            status=InboundStatus.FAILED,
            error=str(exc)[:2000],
        )
        return True

    async def _enqueue(
        self,
        db: AsyncSession,
        message: ChannelMessage,
        text: str,
        *,
        event_id: int,
        user_id: str | None = None,
        session_id: str | None = None,
        kind: str = "reply",
        outbound_id: str | None = None,
        file: FileToSend | None = None,
    ) -> OutboundRow | None:
        """Add a reply to the outbox in the caller's transaction; the row to send once that
        commits, or None for channels whose clients fetch their replies."""
        delivered = message.channel_type.value in self.settings.pull_channels
        if delivered:
            self.metrics.messages_out.labels(message.channel_type.value, "delivered").inc()
        now = self.clock()
        row = await OutboxRepository(db).enqueue(
            delivered=delivered,
            message_id=outbound_id or new_outbound_id(),
            channel_type=message.channel_type.value,
            channel_id=message.channel_id,
            thread_id=message.thread_id,
            in_reply_to=message.message_id,
            kind=kind,
            content=text,
            user_id=user_id,
            session_id=session_id,
            inbound_event_id=event_id,
            reply_context={
                **message.reply_context,
                **({ATTACHMENT_KEY: dataclasses.asdict(file)} if file is not None else {}),
            },
            at=now,
            claimed_until=now + self.reply_lease,
        )
        return None if delivered else row

    def _send(self, reply: OutboundRow | None) -> None:
        """Hand a committed reply to the outbox sender."""
        if reply is not None:
            self.send_reply(reply)

    async def _append_transcript(self, ref: SessionRef, lines: list[TranscriptLine]) -> None:
        # The database is the record; the transcript file is its mirror for archives and
        # exports, rebuilt from the database at PreCompact time, so a failure here only logs.
        try:
            async with self.work_slots.waiting():
                await self.transcripts.append_lines(ref, lines)
        except StorageError as exc:
            log.warning("transcript.append_failed", error=str(exc))


def _line(
    msg_id: str, role: str, message: ChannelMessage, *, content: str, at: datetime, tokens: int
) -> TranscriptLine:
    return TranscriptLine(
        msg_id=msg_id,
        role=role,
        channel=message.channel_type.value,
        thread_id=message.thread_id or None,
        content=content,
        timestamp=at,
        tokens=tokens,
    )


def _stored_line(row: SessionMessage, message: ChannelMessage) -> TranscriptLine:
    blocks = row.metadata_json.get("blocks")
    return _line(
        row.message_id or f"seq-{row.seq}",
        row.role,
        message,
        content=json.dumps(blocks) if blocks else row.content,
        at=row.created_at,
        tokens=row.tokens,
    )


def _message_metadata(message: ChannelMessage) -> dict[str, object]:
    metadata: dict[str, object] = {"channel_id": message.channel_id}
    if message.forwarded is not None:
        metadata["forwarded"] = {
            "sender": message.forwarded.sender,
            "subject": message.forwarded.subject,
            "date": message.forwarded.date,
        }
    if message.attachments:
        metadata["attachments"] = [
            {"filename": a.filename, "content_type": a.content_type, "size": a.size}
            for a in message.attachments
        ]
    return metadata
