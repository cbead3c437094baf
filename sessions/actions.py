"""What users ask of their sessions by command: start anew, resume, forget, look.

The gateway parses the command and words the answer; the session work (routing to the current
session, lifecycle transitions, deletion) happens here, in the command's transaction, and
what goes back is a frozen `SessionView`, never the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncSession

from sessions.export import export_session
from sessions.lifecycle import delete_session, transition
from sessions.routing import Arrival, RoutingPolicy, find_session
from storage.models import Session, SessionStatus
from storage.repositories.sessions import SessionRepository
from storage.transcripts import TranscriptStore


@dataclass(frozen=True, slots=True)
class SessionView:
    """A session as commands and listings show it."""

    id: str
    user_id: str
    org_id: str
    status: str
    created_at: datetime
    last_active_at: datetime
    message_count: int
    user_message_count: int
    assistant_message_count: int
    context_tokens: int
    compaction_count: int
    topic_summary: str

    @classmethod
    def of(cls, row: Session) -> SessionView:
        """The view of a session row."""
        return cls(
            id=row.id,
            user_id=row.user_id,
            org_id=row.org_id,
            status=row.status,
            created_at=row.created_at,
            last_active_at=row.last_active_at,
            message_count=row.message_count,
            user_message_count=row.user_message_count,
            assistant_message_count=row.assistant_message_count,
            context_tokens=row.context_tokens,
            compaction_count=row.compaction_count,
            topic_summary=row.topic_summary,
        )


@dataclass(frozen=True, slots=True)
class ChannelView:
    """A channel (and thread) a session spans."""

    channel_type: str
    channel_id: str
    thread_id: str


@dataclass(frozen=True, slots=True)
class Resumed:
    """The outcome of `/resume`: the session resumed, or why none was."""

    outcome: Literal["resumed", "not_found", "ambiguous"]
    session: SessionView | None = None
    matches: int = 0


@dataclass(frozen=True, slots=True)
class Forgotten:
    """The outcome of `/forget`: asked to confirm, deleted, or nothing to do."""

    outcome: Literal["confirm", "deleted", "no_session", "nothing_to_confirm"]
    session: SessionView | None = None


async def _current_row(
    db: AsyncSession, arrival: Arrival, policy: RoutingPolicy, now: datetime
) -> Session | None:
    route = await find_session(db, arrival, policy, now=now)
    return await SessionRepository(db).get(route.session.id) if route else None


async def current_session(
    db: AsyncSession, arrival: Arrival, policy: RoutingPolicy, *, now: datetime
) -> SessionView | None:
    """The session the user's next message here would continue (None: it would be new)."""
    row = await _current_row(db, arrival, policy, now)
    return SessionView.of(row) if row else None


async def start_new_session(
    db: AsyncSession, arrival: Arrival, policy: RoutingPolicy, *, now: datetime
) -> tuple[SessionView, SessionView | None]:
    """`/new`: a new current session; the previous one (archived if it was active)."""
    current = await _current_row(db, arrival, policy, now)
    created = await SessionRepository(db).create(
        arrival.user_id,
        arrival.org_id,
        scope_channel=arrival.channel_type if policy.scope == "channel" else None,
        at=now,
    )
    if current is not None and current.status == SessionStatus.ACTIVE.value:
        transition(current, SessionStatus.ARCHIVED, at=now, reason="/new")
    return SessionView.of(created), SessionView.of(current) if current else None


async def resume_session(
    db: AsyncSession, arrival: Arrival, policy: RoutingPolicy, prefix: str, *, now: datetime
) -> Resumed:
    """`/resume <prefix>`: make the user's session with that id prefix current again."""
    matches = await SessionRepository(db).find_by_id_prefix(arrival.user_id, prefix.lower())
    if not matches:
        return Resumed("not_found")
    if len(matches) > 1:
        return Resumed("ambiguous", matches=len(matches))
    (target,) = matches
    current = await _current_row(db, arrival, policy, now)
    if (
        current is not None
        and current.id != target.id
        and current.status == SessionStatus.ACTIVE.value
    ):
        transition(current, SessionStatus.ARCHIVED, at=now, reason="/resume")
    if target.status != SessionStatus.ACTIVE.value:
        transition(target, SessionStatus.ACTIVE, at=now, reason="/resume")
    target.last_active_at = now
    target.current_since = now
    return Resumed("resumed", SessionView.of(target))


async def forget_session(
    db: AsyncSession,
    arrival: Arrival,
    policy: RoutingPolicy,
    *,
    confirming: bool,
    now: datetime,
    window: timedelta,
    transcripts: TranscriptStore,
) -> Forgotten:
    """`/forget` asks for a confirmation; `/forget confirm` within `window` deletes the
    current session through the lifecycle (`delete_session`): the logged transition, its
    transcript store objects, then its rows."""
    current = await _current_row(db, arrival, policy, now)
    if current is None:
        return Forgotten("no_session")
    if not confirming:
        current.forget_requested_at = now
        return Forgotten("confirm", SessionView.of(current))
    requested = current.forget_requested_at
    if requested is None or now - requested > window:
        return Forgotten("nothing_to_confirm")
    view = SessionView.of(current)
    # If the transcript store fails, the command fails (and is retried) before any row is
    # gone, so the user is never told "deleted" while archives remain.
    await delete_session(db, current, transcripts=transcripts, at=now, reason="user")
    return Forgotten("deleted", view)


async def list_sessions(db: AsyncSession, user_id: str, *, limit: int) -> list[SessionView]:
    """The user's sessions, most recently active first."""
    rows = await SessionRepository(db).list_for_user(user_id, limit=limit)
    return [SessionView.of(row) for row in rows]


async def sessions_by_prefix(db: AsyncSession, user_id: str, prefix: str) -> list[SessionView]:
    """The user's sessions whose id starts with `prefix` (never another user's)."""
    rows = await SessionRepository(db).find_by_id_prefix(user_id, prefix.lower())
    return [SessionView.of(row) for row in rows]


async def session_channels(db: AsyncSession, session_id: str) -> list[ChannelView]:
    """The channels and threads the session spans, in the order they joined."""
    rows = await SessionRepository(db).channels(session_id)
    return [ChannelView(row.channel_type, row.channel_id, row.thread_id) for row in rows]


async def session_export(db: AsyncSession, session_id: str) -> dict[str, Any] | None:
    """Everything stored about the session (the `/export` file), or None when it is gone."""
    row = await SessionRepository(db).get(session_id)
    return await export_session(db, row) if row else None
