"""The writes of one turn, as few statements as the work needs.

A turn stores the user's message and everything the assistant produced (tool calls, tool
results, the answer) together, after the model answered: one `UPDATE … RETURNING` hands out
the sequence numbers and moves every counter of the session (messages by role, billed tokens,
context use, last activity), one multi-row `INSERT` stores the messages (one more their
vectors), and one `UPDATE` finishes the inbound event. They run through the driver itself
(`storage.driver_rows`), in the caller's transaction: the ORM's unit of work (one flush per
row, objects tracked for nothing) was once most of a turn's CPU, and SQLAlchemy's per-statement
work was still about half of what is left of it. `store_turn_messages` waits for the counters'
statement (its sequence numbers go into the rest); a turn, which read the session's last
number under the user's turn lock, numbers its messages from that and does not wait
(`send_turn`): the counters' update is guarded by the number read.

A turn's whole write (`send_turn`: its messages, the counters, the channel it came through,
its event's finish and its reply's outbox row) is on PostgreSQL one statement, the parts
data-modifying CTEs whose final `SELECT` checks the requirements (`driver_rows.required`: a
refusal aborts the whole statement and the transaction, so the writes go with their commit in
one round trip), and one more for the vectors: those are read from the index entries the
messages' triggers write, which the statement's other parts cannot see. Measured on a scratch
loop of turns (medians of 900-1,400 writes, runs alternated), a turn's write cost 0.98-1.03
CPU-ms as six statements, 0.94-0.95 as two with the messages as arrays, and 0.85-0.93 with a
plain turn's two messages as values (0.93-1.00 as arrays in the same runs); the offline
`bench/e2e.py` run's event loop spent 0.08-0.30 ms a message less (six alternated pairs,
`bench/README.md`).
SQLite, which has no data-modifying CTEs, sends the six, and the caller checks their answers
(`SentTurn`) before it commits.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage import driver_rows
from storage.models import InboundStatus
from storage.recall_vectors import write_turn_vectors
from storage.repositories.outbox import ENQUEUE, QueuedReply, ReplyRow


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


@functools.lru_cache(maxsize=16)
def _insert_messages(count: int) -> str:
    columns = ", ".join(_MESSAGE_COLUMNS)
    rows = driver_rows.values_list(_MESSAGE_COLUMNS, count)
    return f"INSERT INTO session_messages ({columns}) VALUES {rows}"  # noqa: S608 (placeholders)


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
        db, _insert_messages(len(messages)), _message_rows(session_id, messages, first_seq, at)
    )
    await _send_vectors(db, session_id, messages, first_seq)


def _message_rows(
    session_id: str, messages: Sequence[MessageToStore], first_seq: int, at: datetime
) -> dict[str, Any]:
    return driver_rows.numbered(
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
    )


async def _send_vectors(
    db: driver_rows.DriverScope,
    session_id: str,
    messages: Sequence[MessageToStore],
    first_seq: int,
) -> None:
    # Dense recall's vectors, in the same transaction as the entries the triggers just wrote.
    await write_turn_vectors(
        db,
        session_id,
        [(first_seq + i, message.role, message.content) for i, message in enumerate(messages)],
    )


def _finish(
    event_id: int,
    status: InboundStatus,
    at: datetime,
    *,
    user_id: str | None,
    session_id: str | None,
    seq: int | None,
    error: str | None,
) -> dict[str, Any]:
    return {
        "status": status.value,
        "at": at,
        "error": error,
        "user_id": user_id,
        "session_id": session_id,
        "seq": seq,
        "event_id": event_id,
    }


_RECORD_CHANNEL = """INSERT INTO session_channels
    (session_id, channel_type, channel_id, thread_id, joined_at, last_message_at, message_count)
    VALUES (:session_id, :channel_type, :channel_id, :thread_id, :at, :at, 1)
    ON CONFLICT (session_id, channel_type, channel_id, thread_id)
    DO UPDATE SET last_message_at = excluded.last_message_at,
    message_count = session_channels.message_count + 1"""


@dataclass(frozen=True, slots=True)
class ChannelUse:
    """The channel and thread ("": none) a session's message came through."""

    channel_type: str
    channel_id: str
    thread_id: str = ""

    def params(self, session_id: str, at: datetime) -> dict[str, Any]:
        """`_RECORD_CHANNEL`'s parameters."""
        return {
            "session_id": session_id,
            "channel_type": self.channel_type,
            "channel_id": self.channel_id,
            "thread_id": self.thread_id,
            "at": at,
        }


async def send_channel(
    scope: driver_rows.DriverScope,
    session_id: str,
    channel_type: str,
    channel_id: str,
    thread_id: str,
    *,
    at: datetime,
) -> None:
    """Note that a message of the session came through this channel/thread (in a
    `driver_rows.pipelined` block without waiting)."""
    channel = ChannelUse(channel_type, channel_id, thread_id)
    await driver_rows.send(scope, _RECORD_CHANNEL, channel.params(session_id, at))


@dataclass(frozen=True, slots=True)
class TurnRows:
    """Everything a turn writes: its messages, numbered after `after_seq` (the session's
    last number as read under the user's turn lock), what its model calls cost, the channel
    its message came through, its event's finish (`status`, `error`) and its reply's row."""

    session_id: str
    messages: Sequence[MessageToStore]
    after_seq: int
    usage: TurnUsage | None
    channel: ChannelUse
    event_id: int
    status: InboundStatus
    user_id: str
    reply: ReplyRow
    error: str | None = None


@dataclass(frozen=True, slots=True)
class SentTurn:
    """A turn's rows sent (`send_turn`), its first sequence number, and where its answers
    are: the counters', the finish's and the reply's (a statement and the column of its
    one row; on PostgreSQL all three are the one statement's)."""

    session_id: str
    first_seq: int
    counters: tuple[driver_rows.Sent, int]
    finished: tuple[driver_rows.Sent, int]
    queued: tuple[driver_rows.Sent, int]
    reply: QueuedReply  # its id not known yet

    async def event_was_pending(self) -> bool:
        """Whether the finish found the event pending (else someone else answered it)."""
        return await _answer(self.finished) is not None

    async def confirm(self) -> None:
        """Raise `StorageError` when the session's last number was no longer the one read."""
        if await _answer(self.counters) is None:
            raise StorageError(SESSION_MOVED_ON, key=self.session_id)

    async def stored_reply(self) -> QueuedReply:
        """The reply as stored, with its id."""
        return replace(self.reply, id=int(await _answer(self.queued)))


async def _answer(answer: tuple[driver_rows.Sent, int]) -> Any:
    sent, column = answer
    found = await sent.rows()
    return found[0][column] if found else None


async def send_turn(db: driver_rows.DriverScope, turn: TurnRows, *, at: datetime) -> SentTurn:
    """Send a turn's rows in the caller's transaction (in a `driver_rows.pipelined` block
    without waiting); the caller checks the answers (`SentTurn`) before it commits on SQLite,
    while PostgreSQL's statement refuses by itself what must not commit."""
    session_id, messages, first_seq = turn.session_id, turn.messages, turn.after_seq + 1
    counters = {**_counters(session_id, messages, at, turn.usage), "after_seq": turn.after_seq}
    finish = _finish(
        turn.event_id,
        turn.status,
        at,
        user_id=turn.user_id,
        session_id=session_id,
        seq=first_seq,
        error=turn.error,
    )
    channel = turn.channel.params(session_id, at)
    if await driver_rows.on_sqlite(db):
        counted = await driver_rows.send(db, _COUNTERS_AFTER, counters)
        await _send_messages(db, session_id, messages, first_seq, at)
        await driver_rows.send(db, _RECORD_CHANNEL, channel)
        finished = await driver_rows.send(db, _FINISH, finish)
        queued = await driver_rows.send(db, ENQUEUE, turn.reply.values)
        answers = ((counted, 0), (finished, 0), (queued, 0))
    else:
        written = await driver_rows.send(db, *_turn_write(turn, {**counters, **finish}, channel))
        await _send_vectors(db, session_id, messages, first_seq)
        answers = ((written, 0), (written, 1), (written, 2))
    return SentTurn(session_id, first_seq, *answers, turn.reply.reply)


# PostgreSQL: a turn's rows but the vectors as one statement. Its one row is the session's new
# last number, the finished event's id and the reply's, or it fails whole
# (`driver_rows.required`: the counters' refusal first, as when they were statements of their
# own). Every part writes even when a requirement fails: the failure then undoes them all (a
# session that moved on usually fails first at the messages' unique numbers, a `StorageError`
# too). The parts share the values they have in common, so that a plain turn's statement (two
# messages) has fewer than 50 parameters: psycopg parses a statement of more again at every
# call (0.1-0.3 ms of a turn). A turn of more messages (tool calls and results) sends them as
# one array per column, the same text for any number (psycopg dumps an array in Python: for
# two messages, about 0.05 ms of the write more than their values one by one).
_MESSAGE_ARRAYS = {
    "role": "text",
    "channel_type": "text",
    "thread_id": "text",
    "message_id": "text",
    "in_reply_to": "text",
    "content": "text",
    "tokens": "integer",
    "metadata": "text",
}
_MESSAGE_VALUES = tuple(_MESSAGE_ARRAYS)
_MOST_AS_VALUES = 2
_SHARED = {"session_id": "session_id", "at": "at", "user_id": "user_id"}
_REPLY_SHARED = {**_SHARED, "inbound_event_id": "event_id", "created_at": "at"}


def _store_messages(values: int | None) -> str:
    """The messages' INSERT of the turn's statement: `values` messages as rows of values, or
    any number as arrays (None)."""
    columns = ", ".join(_MESSAGE_COLUMNS)
    if values is not None:
        rows = ", ".join(
            f"(:session_id, :after_seq + {n + 1}, :role_{n}, :channel_type_{n}, :thread_id_{n},"
            f" :message_id_{n}, :in_reply_to_{n}, :content_{n}, :tokens_{n}, :at,"
            f" CAST(:metadata_{n} AS json))"
            for n in range(values)
        )
        return f"INSERT INTO session_messages ({columns}) VALUES {rows}"  # noqa: S608
    arrays = ", ".join(f"CAST(:m_{name} AS {kind}[])" for name, kind in _MESSAGE_ARRAYS.items())
    return (
        f"INSERT INTO session_messages ({columns}) "  # noqa: S608 (names and placeholders)
        "SELECT :session_id, :after_seq + m.n, m.role, m.channel_type, m.thread_id,"
        " m.message_id, m.in_reply_to, m.content, m.tokens, :at, CAST(m.metadata AS json)"
        f" FROM unnest({arrays}) WITH ORDINALITY AS m({', '.join(_MESSAGE_ARRAYS)}, n)"
    )


@functools.lru_cache(maxsize=_MOST_AS_VALUES + 1)
def _turn_statement(values: int | None) -> str:
    """The statement for `values` messages as rows of values, or any number as arrays
    (None)."""
    moved = driver_rows.required(SESSION_MOVED_ON)
    answered = driver_rows.required(EVENT_ANSWERED_ELSEWHERE)
    stored = _store_messages(values)
    return (
        f"WITH counted AS ({_COUNTERS_AFTER}),\n"  # noqa: S608 (our own statements)
        f"finished AS ({_FINISH}),\n"
        f"stored AS ({stored}),\n"
        f"joined AS ({driver_rows.prefixed(_RECORD_CHANNEL, 'c_', _SHARED)}),\n"
        f"queued AS ({driver_rows.prefixed(ENQUEUE, 'r_', _REPLY_SHARED)})\n"
        f"SELECT (SELECT max(last_seq) FROM counted HAVING {moved}),\n"
        f"(SELECT max(id) FROM finished HAVING {answered}),\n"
        "(SELECT id FROM queued)"
    )


def _turn_write(
    turn: TurnRows, shared: Mapping[str, Any], channel: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The turn's statement and its parameters: those of the counters and the finish, which
    share their names for the same values (`shared`), then the channel's and the reply's."""
    params = dict(shared)
    for name, value in channel.items():
        if name not in _SHARED:
            params[f"c_{name}"] = value
    for name, value in turn.reply.values.items():
        if name not in _REPLY_SHARED:
            params[f"r_{name}"] = value
        elif value != params[_REPLY_SHARED[name]]:
            raise StorageError(f"a turn's reply has another {name} than the turn")
    messages = [
        (
            m.role,
            m.channel_type,
            m.thread_id,
            m.message_id,
            m.in_reply_to,
            m.content,
            m.tokens,
            json.dumps(dict(m.metadata)),
        )
        for m in turn.messages
    ]
    if len(messages) <= _MOST_AS_VALUES:
        for n, values in enumerate(messages):
            params |= {
                f"{name}_{n}": value for name, value in zip(_MESSAGE_VALUES, values, strict=True)
            }
        return _turn_statement(len(messages)), params
    for position, name in enumerate(_MESSAGE_VALUES):
        params[f"m_{name}"] = [values[position] for values in messages]
    return _turn_statement(None), params
