"""The state of a session as a turn routes to it and reads its context (`SessionState`), read
through the driver (`storage.driver_rows`) without loading the ORM row: one session by id, a
user's current one, or the current one of every scope at once (`CurrentSessions`, which the
dispatcher reads with the user's queue); and a new session's row (`insert_session`), which
every way of starting one goes through."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from storage import driver_rows
from storage.models import Session, SessionStatus
from storage.recall_entries import OTHERS_INDEXED
from storage.repositories._sql import new_session_id


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session as a turn routes to it and reads its context: a frozen value, read without
    loading the row into the ORM (every turn reads one)."""

    id: str
    user_id: str
    org_id: str
    status: str
    created_at: datetime
    last_active_at: datetime
    last_seq: int
    compaction_count: int
    # Whether the user had recall entries of other sessions when this was read (None: not
    # read): recall's search then needs no lookup of its own to know whether it can find
    # anything (`sessions.recall`).
    others_indexed: bool | None = None

    @classmethod
    def of(cls, row: Session) -> SessionState:
        """The state of a row the ORM holds (as changed so far in its transaction)."""
        return cls(
            row.id,
            row.user_id,
            row.org_id,
            row.status,
            row.created_at,
            row.last_active_at,
            row.last_seq,
            row.compaction_count,
        )


# `SessionState`'s fields, in order; two of them timestamps. The last asks whether the user
# has a recall entry in another session: the user's other sessions in turn, each one index
# lookup for an entry (`OTHERS_INDEXED`), the first with one ending it. Asked of the user's
# entries instead (`user_id = … AND session_id <> …`), it read every entry of the current
# session when the user had no other: 33-45 ms a turn for a session of 100,000 messages.
_STATE_COLUMNS = (
    "id, user_id, org_id, status, created_at, last_active_at, last_seq, compaction_count,"
    f" {OTHERS_INDEXED.format(user='sessions.user_id', session='sessions.id')}"
)
_STATE_TIMESTAMPS = (4, 5)
_STATE = f"SELECT {_STATE_COLUMNS} FROM sessions WHERE id = :session_id"  # noqa: S608
# The user's current session: the active (or compacting) one made current last.
_LATEST_ACTIVE = (
    f"SELECT {_STATE_COLUMNS} FROM sessions "  # noqa: S608 (constants only)
    "WHERE user_id = :user_id AND __SCOPE__ AND status IN ('active', 'compacting') "
    "ORDER BY current_since DESC, last_active_at DESC LIMIT 1"
)
_LATEST_ACTIVE_OF_USER = _LATEST_ACTIVE.replace("__SCOPE__", "scope_channel IS NULL")
_LATEST_ACTIVE_IN_SCOPE = _LATEST_ACTIVE.replace("__SCOPE__", "scope_channel = :scope_channel")
# The user's current sessions of every scope, the one made current last first (a user has
# one a scope, and a scope a channel type at most: a few rows).
_CURRENT_OF_USER = (
    f"SELECT {_STATE_COLUMNS}, scope_channel FROM sessions "  # noqa: S608 (constants only)
    "WHERE user_id = :user_id AND status IN ('active', 'compacting') "
    "ORDER BY current_since DESC, last_active_at DESC LIMIT :limit"
)
CURRENT_SESSIONS_READ = 16  # rows read at most; a scope not among them is not known


@dataclass(frozen=True, slots=True)
class CurrentSessions:
    """A user's current session in each scope (None: the user's own, `sessions.scope:
    user`; a channel type with `sessions.scope: channel`), read at one moment. `complete`
    when every active session of the user was read: a scope without one then has none."""

    latest: Mapping[str | None, SessionState]
    complete: bool

    def knows(self, scope_channel: str | None) -> bool:
        """Whether the current session of the scope (or that it has none) is known."""
        return self.complete or scope_channel in self.latest


@dataclass(frozen=True, slots=True)
class CurrentSessionsRead:
    """The read `read_current_sessions` sent; its answer through `value`."""

    sent: driver_rows.Sent

    async def value(self) -> CurrentSessions:
        """The user's current sessions (in a pipeline, after waiting for the answer unless
        the next statement's wait brought it already)."""
        found = await self.sent.rows()
        latest: dict[str | None, SessionState] = {}
        for row in found:
            latest.setdefault(row[-1], _state(row[:-1]))
        return CurrentSessions(latest, complete=len(found) < CURRENT_SESSIONS_READ)


async def read_current_sessions(
    scope: driver_rows.DriverScope, user_id: str
) -> CurrentSessionsRead:
    """Read the user's current session of every scope; in a `driver_rows.pipelined` block
    without waiting, so it goes to the database with the next statement (the dispatcher's
    read of the user's queue: one round trip for both)."""
    sent = await driver_rows.send(
        scope,
        _CURRENT_OF_USER,
        {"user_id": user_id, "limit": CURRENT_SESSIONS_READ},
        timestamps=_STATE_TIMESTAMPS,
    )
    return CurrentSessionsRead(sent)


# A new session: every column the ORM's defaults would fill, given (the table has no server
# defaults). Written as text for the driver: the ORM's unit of work cost about a millisecond
# of CPU for this one row, on every new user's first message.
_INSERT = """INSERT INTO sessions (id, user_id, org_id, scope_channel, status, created_at,
    updated_at, last_active_at, current_since, message_count, user_message_count,
    assistant_message_count, input_tokens, output_tokens, context_tokens, compaction_count,
    last_seq, topic_summary, topics, skills_activated)
    VALUES (:id, :user_id, :org_id, :scope_channel, :status, :at, :at, :at, :at, 0, 0, 0, 0, 0,
    0, 0, 0, '', :empty, :empty)
    RETURNING """ + OTHERS_INDEXED.format(user=":user_id", session=":id")  # noqa: S608 (constants)


async def insert_session(
    scope: driver_rows.DriverScope,
    user_id: str,
    org_id: str,
    *,
    scope_channel: str | None = None,
    at: datetime,
) -> SessionState:
    """Start a new active session for the user, current from `at`; its state, with whether
    the user has recall entries of other sessions, asked by the same statement (the turn's
    recall then needs no statement of its own to know)."""
    session_id = new_session_id()
    status = SessionStatus.ACTIVE.value
    ((others,),) = await driver_rows.rows(
        scope,
        _INSERT,
        {
            "id": session_id,
            "user_id": user_id,
            "org_id": org_id,
            "scope_channel": scope_channel,
            "status": status,
            "at": at,
            "empty": driver_rows.JsonValue([]),
        },
    )
    return SessionState(session_id, user_id, org_id, status, at, at, 0, 0, bool(others))


def _state(row: Sequence[Any]) -> SessionState:
    session_id, user_id, org_id, status, created, active, last_seq, compactions, others = row
    return SessionState(
        session_id, user_id, org_id, status, created, active, last_seq, compactions, bool(others)
    )


async def read_state(scope: driver_rows.DriverScope, session_id: str) -> SessionState | None:
    """The session's state, or None."""
    found = await driver_rows.rows(
        scope, _STATE, {"session_id": session_id}, timestamps=_STATE_TIMESTAMPS
    )
    return _state(found[0]) if found else None


async def latest_active(
    scope: driver_rows.DriverScope, user_id: str, *, scope_channel: str | None = None
) -> SessionState | None:
    """The user's current session (of `scope_channel`, or the user's own scope): the active
    (or compacting) one made current last."""
    params = {"user_id": user_id}
    sql = _LATEST_ACTIVE_OF_USER
    if scope_channel is not None:
        params["scope_channel"] = scope_channel
        sql = _LATEST_ACTIVE_IN_SCOPE
    found = await driver_rows.rows(scope, sql, params, timestamps=_STATE_TIMESTAMPS)
    return _state(found[0]) if found else None
