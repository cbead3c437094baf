"""The session lifecycle state machine: the only place a session's status may change.

```
(none) ─first message─► active ─budget/200 msgs─► compacting ─done─► active
active ─idle > archive_after─► archived ─referenced again─► active
active|archived ─user asks─► exported ─► (back to active/archived, or deleted)
active|archived ─user/admin/retention─► deleted
```

Every deletion goes through `delete_session` (the user's `/forget`, an administrator's
`sessions delete`/`users delete`, the retention job), so each is a logged transition naming
who asked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from errors import SessionStateError
from storage.models import Session, SessionStatus
from storage.repositories.sessions import SessionRepository
from storage.transcripts import SessionRef, TranscriptStore

log = structlog.stdlib.get_logger(__name__)

DeletionReason = Literal["user", "admin", "retention"]
"""Who deleted a session: its user (`/forget`), an administrator, or the retention job."""

ACTIVE, COMPACTING = SessionStatus.ACTIVE, SessionStatus.COMPACTING
ARCHIVED, EXPORTED, DELETED = SessionStatus.ARCHIVED, SessionStatus.EXPORTED, SessionStatus.DELETED

ALLOWED_TRANSITIONS: dict[SessionStatus, frozenset[SessionStatus]] = {
    ACTIVE: frozenset({COMPACTING, ARCHIVED, EXPORTED, DELETED}),
    COMPACTING: frozenset({ACTIVE}),
    ARCHIVED: frozenset({ACTIVE, EXPORTED, DELETED}),
    EXPORTED: frozenset({ACTIVE, ARCHIVED, DELETED}),
    DELETED: frozenset(),
}


def check_transition(current: SessionStatus, target: SessionStatus) -> None:
    """Raise `SessionStateError` unless the lifecycle allows `current → target`."""
    if target not in ALLOWED_TRANSITIONS[current]:
        raise SessionStateError(f"a session cannot go from {current} to {target}")


def transition(session: Session, target: SessionStatus, *, at: datetime, reason: str) -> None:
    """Move a loaded session row to `target` (the caller's transaction stores it) and log it."""
    current = SessionStatus(session.status)
    check_transition(current, target)
    session.status = target.value
    session.updated_at = at
    if target is ARCHIVED:
        session.archived_at = at
    log.info(
        "session.transitioned",
        session_id=session.id,
        user_id=session.user_id,
        from_status=current.value,
        to_status=target.value,
        reason=reason,
    )


async def archive_session(
    db: AsyncSession,
    session_id: str,
    *,
    at: datetime,
    reason: str,
    idle_before: datetime | None = None,
) -> Session | None:
    """Archive the session in the caller's transaction (its row locked until the end).

    With `idle_before`, only an active session last active before then (the idle job, which
    checks again under the row lock what it listed without one). The archived row, or None
    when there was nothing to archive.
    """
    session = await SessionRepository(db).get(session_id, for_update=True)
    if session is None:
        return None
    if idle_before is not None and (
        session.status != ACTIVE.value or session.last_active_at >= idle_before
    ):
        return None
    transition(session, ARCHIVED, at=at, reason=reason)
    return session


async def delete_session(
    db: AsyncSession,
    session: Session,
    *,
    transcripts: TranscriptStore,
    at: datetime,
    reason: DeletionReason,
) -> int:
    """Delete a session the caller's transaction loaded, for good; how many transcript store
    objects went.

    The logged transition to `deleted` comes first (an illegal one, such as a session in the
    middle of a compaction, raises before anything is removed), then the transcript store's
    objects (segments, compactions, archives), then the rows (by cascade: messages, channels,
    compactions, summaries, recall entries, inbound and outbound payloads).
    """
    transition(session, DELETED, at=at, reason=reason)
    # The transcript store first: if it fails, the caller's transaction rolls back before any
    # row is gone, so nobody is told "deleted" while archives remain, and it can be repeated.
    objects = await transcripts.delete_session(
        SessionRef(session.org_id, session.user_id, session.id)
    )
    # The status change goes to the database while the row is still there to take it.
    await db.flush()
    await SessionRepository(db).delete(session.id)
    return objects
