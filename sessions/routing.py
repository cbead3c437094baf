"""Session resolution: which session an inbound message of a known user belongs to.

In order: a thread already tracked → its session (reactivated if archived); an email answering
a message we sent → that message's session; the user's active session, if its last activity is
within `sessions.archive_after` (an older one is archived on the spot); with
`recall.resume_by_reference`, an archived session the message clearly continues; else a new
session. With
`sessions.scope: channel` each channel type has its own active session.

A turn first routes by reads alone (`find_unchanged`, no transaction on PostgreSQL, no lock
on SQLite): most messages continue a session as it stands. Only when something has to change
does routing run inside the turn's first transaction (`sessions.turn`), given what the reads
found (`Unrouted`), as it does in a command's, on the loaded row; what leaves `sessions` is a
frozen `SessionView`, never the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from primitives.bounded_cache import BoundedCache
from sessions.lifecycle import transition
from storage.database import Database
from storage.models import Session, SessionStatus
from storage.repositories.outbox import OutboxRepository
from storage.repositories.session_state import (
    CurrentSessions,
    SessionState,
    insert_session,
    latest_active,
)
from storage.repositories.sessions import SessionRepository

log = structlog.stdlib.get_logger(__name__)

Scope = Literal["user", "channel"]

KNOWN_THREADS = 100_000  # threads remembered as owned by a session


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    """The config values routing depends on."""

    scope: Scope
    archive_after: timedelta


@dataclass(frozen=True, slots=True)
class Arrival:
    """A user's message as routing sees it: who sent it and where it came from."""

    user_id: str
    org_id: str
    channel_type: str
    channel_id: str
    thread_id: str = ""
    # Message ids this one answers (email In-Reply-To/References): their session continues.
    references: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Route:
    """Where a message goes, and how that was decided (for logs and notices)."""

    session: SessionState
    reason: Literal["thread", "reply", "active", "reference", "new"]
    reactivated: bool = False
    # The message's thread belongs to another user's session: the message is answered in it,
    # from this session, but the thread stays with its owner.
    thread_taken: bool = False


@dataclass(frozen=True, slots=True)
class Unrouted:
    """A message that continues no session as it stands: `fresh` when there is nothing to
    continue (no thread, reply or current session of its user: it starts a session, unless it
    resumes one by reference), and whether its thread belongs to another user's session."""

    fresh: bool
    thread_taken: bool = False


async def find_session(
    session: AsyncSession,
    arrival: Arrival,
    policy: RoutingPolicy,
    *,
    now: datetime,
) -> Route | None:
    """The session the message continues, without creating one (None: it would be new)."""
    found = await _continued(session, arrival, policy, now=now)
    return found if isinstance(found, Route) else None


async def find_unchanged(
    session: AsyncSession,
    arrival: Arrival,
    policy: RoutingPolicy,
    *,
    now: datetime,
) -> Route | Unrouted:
    """The route of a message that continues a session as it stands (neither archived nor
    idle past `archive_after`), found by reads alone. Otherwise routing has something to
    change (reactivate, archive or create a session), which `resolve_session` then does in a
    transaction, given what was found here."""
    return await _continued(session, arrival, policy, now=now, change=False)


def route_current(
    arrival: Arrival, policy: RoutingPolicy, current: CurrentSessions, *, now: datetime
) -> Route | Unrouted | None:
    """What `find_unchanged` finds for the message, from the user's current sessions read
    beforehand under the same turn lock (the dispatcher reads them with the user's queue);
    None when that is not enough: the message names a thread or answers a message of ours
    (their sessions are looked up), or its scope's session was not among those read."""
    if arrival.thread_id or arrival.references:
        return None
    scope_channel = arrival.channel_type if policy.scope == "channel" else None
    if not current.knows(scope_channel):
        return None
    return _as_it_stands(current.latest.get(scope_channel), policy, now=now, thread_taken=False)


async def resolve_session(
    session: AsyncSession,
    arrival: Arrival,
    policy: RoutingPolicy,
    *,
    now: datetime,
    referenced: str | None = None,
    unrouted: Unrouted | None = None,
) -> Route:
    """The session the message belongs to, created when there is none to continue.

    `referenced` names an archived session the message clearly continues (found by recall,
    with `recall.resume_by_reference`); it is used only when nothing else claims the message.
    `unrouted` is what `find_unchanged` found just before, under the same turn lock: when
    there was nothing to continue, nothing is looked up again (only this user's turns create
    or reactivate its sessions, and they wait for the lock).
    """
    found: Route | Unrouted
    if unrouted is not None and unrouted.fresh:
        found = unrouted
    else:
        found = await _continued(session, arrival, policy, now=now)
    if isinstance(found, Route):
        return found
    thread_taken = found.thread_taken
    scope_channel = arrival.channel_type if policy.scope == "channel" else None
    if referenced is not None:
        candidate = await SessionRepository(session).get(referenced, for_update=True)
        if (
            candidate is not None
            and candidate.user_id == arrival.user_id
            and candidate.scope_channel == scope_channel
            and _reactivate(candidate, now=now, reason="reference")
        ):
            candidate.current_since = now
            log.info(
                "session.resumed_by_reference", session_id=candidate.id, user_id=arrival.user_id
            )
            return Route(
                SessionState.of(candidate), "reference", reactivated=True, thread_taken=thread_taken
            )
    created = await insert_session(
        session, arrival.user_id, arrival.org_id, scope_channel=scope_channel, at=now
    )
    log.info("session.created", session_id=created.id, user_id=arrival.user_id)
    return Route(created, "new", thread_taken=thread_taken)


async def _continued(
    session: AsyncSession,
    arrival: Arrival,
    policy: RoutingPolicy,
    *,
    now: datetime,
    change: bool = True,
) -> Route | Unrouted:
    """The route of a continued session; otherwise whether the message starts a session
    (with `change`, after archiving an idle one; without, only when there is none) and whether
    its thread belongs to another user's session."""
    sessions = SessionRepository(session)
    channel = arrival.channel_type
    owner = await sessions.find_by_thread(channel, arrival.channel_id, arrival.thread_id)
    thread_taken = owner is not None and owner.user_id != arrival.user_id
    replied_to = await _session_replied_to(session, arrival)
    for candidate, reason in ((owner, "thread"), (replied_to, "reply")):
        if candidate is not None and candidate.user_id == arrival.user_id:
            if not change and candidate.status in _CLOSED:
                return Unrouted(fresh=False, thread_taken=thread_taken)
            reactivated = _reactivate(candidate, now=now, reason=reason)
            return Route(SessionState.of(candidate), reason, reactivated)  # type: ignore[arg-type]
    scope_channel = channel if policy.scope == "channel" else None
    active = await latest_active(session, arrival.user_id, scope_channel=scope_channel)
    if change and active is not None and now - active.last_active_at > policy.archive_after:
        idle = await sessions.get(active.id)
        if idle is not None and idle.status == SessionStatus.ACTIVE.value:
            transition(idle, SessionStatus.ARCHIVED, at=now, reason="idle")
        return Unrouted(fresh=True, thread_taken=thread_taken)
    return _as_it_stands(active, policy, now=now, thread_taken=thread_taken)


def _as_it_stands(
    active: SessionState | None, policy: RoutingPolicy, *, now: datetime, thread_taken: bool
) -> Route | Unrouted:
    """The route to the user's current session `active` as it stands: unrouted when there is
    none (fresh) or it has been idle past `archive_after` (to be archived first)."""
    if active is None:
        return Unrouted(fresh=True, thread_taken=thread_taken)
    if now - active.last_active_at > policy.archive_after:
        return Unrouted(fresh=False, thread_taken=thread_taken)
    return Route(active, "active", thread_taken=thread_taken)


async def _session_replied_to(session: AsyncSession, arrival: Arrival) -> Session | None:
    if not arrival.references:
        return None
    session_id = await OutboxRepository(session).session_of_message(arrival.references)
    if session_id is None:
        return None
    return await SessionRepository(session).get(session_id)


_CLOSED = (SessionStatus.ARCHIVED.value, SessionStatus.EXPORTED.value)
"""The states a session referenced by a thread or a reply is reactivated from."""


def _reactivate(candidate: Session, *, now: datetime, reason: str) -> bool:
    if candidate.status in _CLOSED:
        transition(candidate, SessionStatus.ACTIVE, at=now, reason=f"referenced by {reason}")
        return True
    return False


class SessionThreads:
    """Which threads of a channel belong to a session (the Slack adapter's thread directory).

    A thread never stops belonging to its session, so positive answers are cached (the
    `KNOWN_THREADS` most recently asked about).
    """

    def __init__(self, database: Database, channel_type: str) -> None:
        self.database = database
        self.channel_type = channel_type
        self._known: BoundedCache[tuple[str, str], bool] = BoundedCache(KNOWN_THREADS)

    async def has_thread(self, channel_id: str, thread_id: str) -> bool:
        """True when a session owns the thread `thread_id` in `channel_id`."""
        key = (channel_id, thread_id)
        if self._known.get(key):
            return True  # `get`, not `in`: a thread in use stays among the most recent
        async with self.database.session() as session:
            owner = await SessionRepository(session).find_by_thread(
                self.channel_type, channel_id, thread_id
            )
        if owner is None:
            return False
        self._known.put(key, True)
        return True
