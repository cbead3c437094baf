"""A turn's write (`write_turn`): the user's message and everything the turn produced, the
session's counters and usage, the channel it came through, the inbound event finished and
the reply in the outbox, committed together or not at all.

The statements (`storage.turn_store.send_turn`: two on PostgreSQL, six on SQLite) go
through the driver in one pipeline (`storage.driver_rows`). On PostgreSQL they end in one
`Sync` that commits them, and what the turn must not commit without (its event still
pending, its session's last number still the one it read under the user's turn lock) the
statement checks itself: a refusal aborts the transaction and surfaces at the next statement
sent or at the commit. On SQLite the answers are checked before the caller's session
commits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from errors import StorageError
from sessions.engine_values import NewMessage, TurnOutcome
from sessions.files.turn_files import TurnFiles
from sessions.llm import estimate_tokens
from sessions.routing import Route
from sessions.turn_values import LIVE_REPLY_KEY, TurnSupersededError, UserTurn
from storage.driver_rows import DriverScope, Pipeline, RequirementError, pipelined
from storage.models import InboundStatus
from storage.repositories.outbox import QueuedReply, ReplyRow, reply_row
from storage.turn_store import (
    EVENT_ANSWERED_ELSEWHERE,
    ChannelUse,
    MessageToStore,
    TurnRows,
    TurnUsage,
    send_turn,
)


@dataclass(frozen=True, slots=True)
class TurnReply:
    """The reply a turn writes: its text and outbox id, the outcome it came from (None: the
    model failed, `failure` says how, and the reply is an apology), and the live message it
    finishes, if any."""

    text: str
    outbound_id: str
    outcome: TurnOutcome | None
    failure: str | None = None
    live: Mapping[str, Any] | None = None


def messages_to_store(
    turn: UserTurn,
    content: str,
    files: TurnFiles | None,
    produced: Sequence[NewMessage],
    reply_id: str,
) -> list[MessageToStore]:
    """The user's message (`content`: its text with the files' text) and what the turn
    produced, the last of it the reply, as the write stores them."""
    arrival = turn.arrival
    last = len(produced) - 1
    return [
        MessageToStore(
            role="user",
            channel_type=arrival.channel_type,
            thread_id=arrival.thread_id,
            content=content,
            message_id=turn.message_id,
            # What later turns resend: the stored text (the files' native pages and
            # pictures go with this turn only).
            tokens=estimate_tokens(content),
            metadata={**turn.metadata, "files": list(files.records)}
            if files is not None
            else turn.metadata,
        ),
        *(
            MessageToStore(
                role=message.role,
                channel_type=arrival.channel_type,
                thread_id=arrival.thread_id,
                content=message.content,
                tokens=message.tokens,
                message_id=reply_id if position == last else None,
                in_reply_to=turn.message_id if position == last else None,
                # Tool calls and results are kept block by block, to be resent exactly.
                metadata={"blocks": list(message.blocks)}
                if any(block.get("type") != "text" for block in message.blocks)
                else {},
            )
            for position, message in enumerate(produced)
        ),
    ]


async def write_turn(
    db: DriverScope,
    turn: UserTurn,
    route: Route,
    to_store: Sequence[MessageToStore],
    reply: TurnReply,
    *,
    at: datetime,
    reply_lease: timedelta,
) -> tuple[int, QueuedReply | None]:
    """Write the turn in the caller's transaction (committed here on PostgreSQL); the first
    sequence number stored and the reply, claimed by this process for `reply_lease` (None
    on a pull channel, where being stored is being delivered). Raises
    `TurnSupersededError` when the event was finished elsewhere, `StorageError` when the
    session's messages moved on: nothing is then written."""
    arrival, session_id, outcome = turn.arrival, route.session.id, reply.outcome
    rows = TurnRows(
        session_id,
        to_store,
        # Numbered after the last message the turn read: under the user's turn lock nothing
        # else appends to the session (checked before anything commits).
        after_seq=route.session.last_seq,
        usage=TurnUsage(outcome.input_tokens, outcome.output_tokens, outcome.context_tokens)
        if outcome
        else None,
        channel=ChannelUse(
            arrival.channel_type,
            arrival.channel_id,
            "" if route.thread_taken else arrival.thread_id,
        ),
        event_id=turn.event_id,
        status=InboundStatus.DONE if outcome else InboundStatus.FAILED,
        user_id=arrival.user_id,
        reply=_reply_row(turn, session_id, reply, at=at, lease=reply_lease),
        error=reply.failure,
    )
    async with _pipelined_write(db, turn.event_id) as pipeline:
        sent = await send_turn(db, rows, at=at)
        await pipeline.commit()
    # On PostgreSQL the statement checked these itself, before its commit (`_pipelined_write`
    # maps what it refused), and the answers agree; on SQLite they are checked here, and the
    # session commits when it ends.
    if not await sent.event_was_pending():
        raise TurnSupersededError(EVENT_ANSWERED_ELSEWHERE, key=str(turn.event_id))
    await sent.confirm()
    outbound = None if turn.reply_to.delivered_on_store else await sent.stored_reply()
    return sent.first_seq, outbound


def _reply_row(
    turn: UserTurn, session_id: str, reply: TurnReply, *, at: datetime, lease: timedelta
) -> ReplyRow:
    """The reply's outbox row, queued already claimed by this process for `lease`."""
    address = turn.reply_to
    reply_context = dict(address.reply_context)
    if reply.live is not None:
        reply_context[LIVE_REPLY_KEY] = dict(reply.live)
    return reply_row(
        delivered=address.delivered_on_store,
        message_id=reply.outbound_id,
        channel_type=address.channel_type,
        channel_id=address.channel_id,
        thread_id=address.thread_id,
        in_reply_to=turn.message_id,
        kind="reply" if reply.outcome else "notice",
        content=reply.text,
        user_id=turn.arrival.user_id,
        session_id=session_id,
        inbound_event_id=turn.event_id,
        reply_context=reply_context,
        at=at,
        claimed_until=at + lease,
    )


@asynccontextmanager
async def _pipelined_write(db: DriverScope, event_id: int) -> AsyncIterator[Pipeline]:
    """The pipelined block of a turn's writes, committed by `Pipeline.commit` or, in an
    atomic scope (`Database.driver_atomic`), by the block's end. A requirement its statements
    found unmet (PostgreSQL) surfaces at the next statement sent, at the commit or at the
    block's end: the event answered elsewhere is `TurnSupersededError`. After any
    statement's error, the answers still queued (aborted) are taken before the block ends,
    so the session rolls back a clean connection."""
    try:
        async with pipelined(db) as pipeline:
            try:
                yield pipeline
            except StorageError:
                # A connection that broke fails here too: the session's rollback meets it.
                with suppress(StorageError):
                    await pipeline.recover()
                raise
    except RequirementError as failed:
        if failed.reason == EVENT_ANSWERED_ELSEWHERE:
            raise TurnSupersededError(EVENT_ANSWERED_ELSEWHERE, key=str(event_id)) from failed
        raise
