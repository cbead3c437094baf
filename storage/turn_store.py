"""The writes of one turn, as few statements as the work needs.

A turn stores the user's message and everything the assistant produced (tool calls, tool
results, the answer) together, after the model answered: one `UPDATE … RETURNING` hands out
the sequence numbers and moves every counter of the session (messages by role, billed tokens,
context use, last activity), one multi-row `INSERT` stores the messages (one more their
vectors), and one `UPDATE` finishes the inbound event. They run through the driver itself
(`storage.driver_rows`), in the caller's transaction: the ORM's unit of work (one flush per
row, objects tracked for nothing) was once most of a turn's CPU, and SQLAlchemy's per-statement
work was still about half of what is left of it. In a `driver_rows.pipelined` block they go
out with the caller's next statement that is waited for. `store_turn_messages` waits for the
counters' statement (its sequence numbers go into the rest); a turn, which read the session's
last number under the user's turn lock, numbers its messages from that and does not wait
(`send_turn_messages`): the counters' update is guarded by the number read. A turn's writes
are checked before they commit: on SQLite by the caller, reading the answers (`SentMessages.
confirm`, the event's finish found pending); on PostgreSQL by the statements themselves
(`driver_rows.required`), so that the writes go with their `COMMIT` in one round trip
(`driver_rows.Pipeline.commit`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage import driver_rows
from storage.models import InboundStatus
from storage.recall_vectors import write_turn_vectors


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


_COUNTERS = """UPDATE sessions SET
    last_seq = last_seq + :count, message_count = message_count + :count,
    user_message_count = user_message_count + :users,
    assistant_message_count = assistant_message_count + :assistants,
    input_tokens = input_tokens + :input_tokens, output_tokens = output_tokens + :output_tokens,
    context_tokens = COALESCE(CAST(:context_tokens AS INTEGER), context_tokens),
    last_active_at = :at, updated_at = :at
    WHERE id = :session_id __AFTER__ RETURNING last_seq"""
_COUNTERS_NEXT = _COUNTERS.replace("__AFTER__", "")
_COUNTERS_AFTER = _COUNTERS.replace("__AFTER__", "AND last_seq = :after_seq")
SESSION_MOVED_ON = "the session moved on while the turn ran"
EVENT_ANSWERED_ELSEWHERE = "the event was answered elsewhere"
# PostgreSQL: the same statements, aborting the transaction when they change no row (a turn's
# writes go with their COMMIT in one round trip, `driver_rows.Pipeline.commit`); the same row
# back when they do.
_COUNTERS_AFTER_REQUIRED = (
    f"WITH counted AS ({_COUNTERS_AFTER}) SELECT max(last_seq) FROM counted"  # noqa: S608
    f" HAVING {driver_rows.required(SESSION_MOVED_ON)}"
)
_MESSAGE_COLUMNS = (
    "session_id",
    "seq",
    "role",
    "channel_type",
    "thread_id",
    "message_id",
    "in_reply_to",
    "content",
    "tokens",
    "created_at",
    "metadata",
)
_FINISH = """UPDATE inbound_events SET status = :status, processed_at = :at, error = :error,
    user_id = COALESCE(:user_id, user_id), session_id = COALESCE(:session_id, session_id),
    appended_seq = COALESCE(CAST(:seq AS INTEGER), appended_seq)
    WHERE id = :event_id AND status = 'pending' RETURNING id"""
_FINISH_REQUIRED = (
    f"WITH finished AS ({_FINISH}) SELECT max(id) FROM finished"  # noqa: S608
    f" HAVING {driver_rows.required(EVENT_ANSWERED_ELSEWHERE)}"
)


@functools.lru_cache(maxsize=16)
def _insert_messages(count: int) -> str:
    columns = ", ".join(_MESSAGE_COLUMNS)
    rows = driver_rows.values_list(_MESSAGE_COLUMNS, count)
    return f"INSERT INTO session_messages ({columns}) VALUES {rows}"  # noqa: S608 (placeholders)


@dataclass(frozen=True, slots=True)
class SentMessages:
    """A turn's messages sent numbered after the sequence number the caller read
    (`send_turn_messages`); `confirm` once the pipeline's answers are in."""

    session_id: str
    first_seq: int
    counters: driver_rows.Sent

    async def confirm(self) -> None:
        """Raise `StorageError` when the session's last number was no longer the one read
        (or the session is gone): the transaction must roll back."""
        if not await self.counters.rows():
            raise StorageError(SESSION_MOVED_ON, key=self.session_id)


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
    found = await driver_rows.rows(db, _COUNTERS_NEXT, _counters(session_id, messages, at, usage))
    if not found:
        raise StorageError("the session does not exist", key=session_id)
    first_seq = int(found[0][0]) - len(messages) + 1
    await _send_messages(db, session_id, messages, first_seq, at)
    return first_seq


async def send_turn_messages(
    db: driver_rows.DriverScope,
    session_id: str,
    messages: Sequence[MessageToStore],
    *,
    after_seq: int,
    at: datetime,
    usage: TurnUsage | None = None,
) -> SentMessages:
    """Append `messages` numbered from `after_seq`, the session's last sequence number as
    the caller read it while holding the user's turn lock (only the user's turns append to
    their sessions, one at a time), and update the counters if it still is; in a
    `driver_rows.pipelined` block nothing waits, one round trip fewer than
    `store_turn_messages`. `SentMessages.confirm` before committing: if the number had
    moved, the counters' update changed nothing and the transaction must not commit (its
    numbers usually collide with stored messages first, an error of their own). On
    PostgreSQL the counters' statement then aborts the transaction itself (`SESSION_MOVED_ON`,
    as `driver_rows.RequirementError`)."""
    counters = await driver_rows.send(
        db,
        _COUNTERS_AFTER if await driver_rows.on_sqlite(db) else _COUNTERS_AFTER_REQUIRED,
        {**_counters(session_id, messages, at, usage), "after_seq": after_seq},
    )
    await _send_messages(db, session_id, messages, after_seq + 1, at)
    return SentMessages(session_id, after_seq + 1, counters)


def _counters(
    session_id: str, messages: Sequence[MessageToStore], at: datetime, usage: TurnUsage | None
) -> dict[str, Any]:
    if not messages:
        raise StorageError("a turn stores at least one message", key=session_id)
    roles = [message.role for message in messages]
    usage = usage or TurnUsage()
    return {
        "count": len(messages),
        "users": roles.count("user"),
        "assistants": roles.count("assistant"),
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "context_tokens": usage.context_tokens,
        "at": at,
        "session_id": session_id,
    }


async def _send_messages(
    db: driver_rows.DriverScope,
    session_id: str,
    messages: Sequence[MessageToStore],
    first_seq: int,
    at: datetime,
) -> None:
    """The messages' rows numbered from `first_seq`, and their vectors."""
    await driver_rows.send(
        db,
        _insert_messages(len(messages)),
        driver_rows.numbered(
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
                    "metadata": driver_rows.JsonValue(dict(message.metadata)),
                }
                for position, message in enumerate(messages)
            ]
        ),
    )
    # Dense recall's vectors, in the same transaction as the entries the triggers just wrote.
    await write_turn_vectors(
        db,
        session_id,
        [(first_seq + i, message.role, message.content) for i, message in enumerate(messages)],
    )


async def finish_inbound_event(
    db: driver_rows.DriverScope,
    event_id: int,
    status: InboundStatus,
    *,
    at: datetime,
    user_id: str | None = None,
    session_id: str | None = None,
    seq: int | None = None,
    error: str | None = None,
) -> driver_rows.Sent:
    """Mark a pending event finished (with where its message went); in a `pipelined` block
    without waiting. Its rows are none when the event was not pending any more, which must
    roll the caller's transaction back: someone else answered. On PostgreSQL the statement
    itself then aborts the transaction (`driver_rows.RequirementError`, its reason
    `EVENT_ANSWERED_ELSEWHERE`), so the caller may commit before looking."""
    return await driver_rows.send(
        db,
        _FINISH if await driver_rows.on_sqlite(db) else _FINISH_REQUIRED,
        {
            "status": status.value,
            "at": at,
            "error": error,
            "user_id": user_id,
            "session_id": session_id,
            "seq": seq,
            "event_id": event_id,
        },
    )
