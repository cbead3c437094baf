"""The writes of one turn, as few statements as the work needs.

A turn stores the user's message and everything the assistant produced (tool calls, tool
results, the answer) together, after the model answered: one `UPDATE … RETURNING` hands out
the sequence numbers and moves every counter of the session (messages by role, billed tokens,
context use, last activity), one multi-row `INSERT` stores the messages, and one `UPDATE`
finishes the inbound event. They are SQLAlchemy Core statements: the ORM's unit of work (one
flush per row, objects tracked for nothing) was most of a turn's CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Table, insert, update
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage.models import InboundEvent, InboundStatus, Session, SessionMessage
from storage.recall_vectors import write_turn_vectors

# The tables, not the mapped classes: statements on a class go through the ORM's bulk
# persistence layer, which costs more than the statement for nothing a turn uses.
SESSIONS: Table = Session.__table__  # type: ignore[assignment]
MESSAGES: Table = SessionMessage.__table__  # type: ignore[assignment]
EVENTS: Table = InboundEvent.__table__  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class MessageToStore:
    """One message of a turn, before it has a sequence number."""

    role: str
    channel_type: str
    content: str
    tokens: int
    thread_id: str = ""
    message_id: str | None = None
    in_reply_to: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """What the turn's model calls cost and how full the context was."""

    input_tokens: int = 0
    output_tokens: int = 0
    context_tokens: int | None = None


async def store_turn_messages(
    db: AsyncSession,
    session_id: str,
    messages: Sequence[MessageToStore],
    *,
    at: datetime,
    usage: TurnUsage | None = None,
) -> int:
    """Append `messages` to the session in order and update its counters; the first new
    sequence number. The counter update takes the session row's write lock, so concurrent
    writers queue and never share a number."""
    if not messages:
        raise StorageError("a turn stores at least one message", key=session_id)
    roles = [message.role for message in messages]
    columns = SESSIONS.c
    counters: dict[str, Any] = {
        "last_seq": columns.last_seq + len(messages),
        "message_count": columns.message_count + len(messages),
        "last_active_at": at,
        "updated_at": at,
    }
    if users := roles.count("user"):
        counters["user_message_count"] = columns.user_message_count + users
    if assistants := roles.count("assistant"):
        counters["assistant_message_count"] = columns.assistant_message_count + assistants
    if usage is not None:
        counters["input_tokens"] = columns.input_tokens + usage.input_tokens
        counters["output_tokens"] = columns.output_tokens + usage.output_tokens
        if usage.context_tokens is not None:
            counters["context_tokens"] = usage.context_tokens
    result = await db.execute(
        update(SESSIONS)
        .where(columns.id == session_id)
        .values(counters)
        .returning(columns.last_seq)
    )
    last_seq = result.scalar_one_or_none()
    if last_seq is None:
        raise StorageError("the session does not exist", key=session_id)
    first_seq = int(last_seq) - len(messages) + 1
    await db.execute(
        insert(MESSAGES),
        [
            {
                "session_id": session_id,
                "seq": first_seq + position,
                "role": message.role,
                "channel_type": message.channel_type,
                "thread_id": message.thread_id,
                "message_id": message.message_id,
                "in_reply_to": message.in_reply_to,
                "content": message.content,
                "tokens": message.tokens,
                "created_at": at,
                "metadata": dict(message.metadata),
            }
            for position, message in enumerate(messages)
        ],
    )
    # Dense recall's vectors, in the same transaction as the entries the triggers just wrote.
    await write_turn_vectors(
        db,
        session_id,
        [(first_seq + i, message.role, message.content) for i, message in enumerate(messages)],
    )
    return first_seq


async def finish_inbound_event(
    db: AsyncSession,
    event_id: int,
    status: InboundStatus,
    *,
    at: datetime,
    user_id: str | None = None,
    session_id: str | None = None,
    seq: int | None = None,
    error: str | None = None,
) -> bool:
    """Mark a pending event finished (with where its message went); False when it was not
    pending any more, which must roll the caller's transaction back: someone else answered."""
    values: dict[str, Any] = {"status": status.value, "processed_at": at, "error": error}
    if user_id is not None:
        values["user_id"] = user_id
    if session_id is not None:
        values["session_id"] = session_id
    if seq is not None:
        values["appended_seq"] = seq
    result = await db.execute(
        update(EVENTS)
        .where(EVENTS.c.id == event_id, EVENTS.c.status == InboundStatus.PENDING.value)
        .values(values)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]
