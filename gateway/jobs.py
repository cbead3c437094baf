"""Background jobs, run by one leader at a time across every gateway process.

Leadership is a lease row in the database, renewed on every run; when the leader dies its
lease expires and another process takes over. The jobs: archive sessions idle longer than
`sessions.archive_after`, retry compactions that had to wait, write the summaries (and
memory facts) of archived sessions, and delete archived sessions past
`retention.delete_after_days`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime, timedelta

from errors import GatewayError
from gateway.admin import Administration
from gateway.files import sweep_stash
from gateway.log import get_logger
from sessions.engine import SessionEngine
from sessions.lifecycle import archive_session
from storage.database import Database
from storage.locks import TurnLocks
from storage.models import SessionStatus
from storage.repositories.admin import AdminRepository
from storage.repositories.leases import LeaseRepository
from storage.repositories.sessions import SessionRepository

log = get_logger(__name__)

LEASE_NAME = "background-jobs"


def holder_id() -> str:
    """A name for this process that no other process shares."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class BackgroundJobs:
    """Runs the periodic jobs while this process holds the leader lease."""

    def __init__(
        self,
        database: Database,
        locks: TurnLocks,
        engine: SessionEngine,
        *,
        archive_after: timedelta,
        clock: Callable[[], datetime],
        interval: float | None = None,
        admin: Administration | None = None,
        delete_after: timedelta | None = None,
    ) -> None:
        self.database = database
        self.locks = locks
        self.engine = engine
        self.archive_after = archive_after
        self.admin = admin
        self.delete_after = delete_after
        self.clock = clock
        # Often enough that a session is archived soon after it passes `archive_after`.
        self.interval = interval or min(60.0, max(0.5, archive_after.total_seconds() / 4))
        self.holder = holder_id()
        self._stop = asyncio.Event()

    def reconfigure(self, archive_after: timedelta, delete_after: timedelta | None) -> None:
        """Apply reloaded archiving and retention periods from the next pass."""
        self.archive_after = archive_after
        self.delete_after = delete_after

    async def run(self) -> None:
        """Run the jobs every `interval` seconds until `stop()`, when this process leads."""
        while not self._stop.is_set():
            try:
                if await self._lead():
                    await self.archive_idle_sessions()
                    await self.retry_deferred_compactions()
                    await self.engine.summarise_archived_sessions()
                    await self.enforce_retention()
                    if self.admin is not None:
                        await sweep_stash(self.database, self.admin.transcripts, self.clock())
            except (GatewayError, OSError) as exc:
                log.error("jobs.failed", error=str(exc).splitlines()[0])
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval)
        with suppress(GatewayError, OSError):
            async with self.database.session() as db:
                await LeaseRepository(db).release(LEASE_NAME, self.holder)

    def stop(self) -> None:
        """Stop after the current run."""
        self._stop.set()

    async def _lead(self) -> bool:
        ttl = timedelta(seconds=max(30.0, 3 * self.interval))
        async with self.database.session() as db:
            return await LeaseRepository(db).try_acquire(
                LEASE_NAME, self.holder, now=self.clock(), ttl=ttl
            )

    async def retry_deferred_compactions(self) -> int:
        """Compact sessions whose compaction had to wait (store down) or was cut short by a
        crash, without waiting for their user's next message; how many were compacted."""
        policy = self.engine.compactor.policy
        async with self.database.session() as db:
            due = await SessionRepository(db).needing_compaction(
                context_tokens_over=int(policy.trigger_ratio * policy.budget_tokens)
            )
        compacted = 0
        for candidate in due:
            async with self.locks.hold(f"user:{candidate.user_id}") as held:
                if held and await self.engine.compactor.compact(candidate.id) is not None:
                    compacted += 1
        if compacted:
            log.info("jobs.compactions_retried", count=compacted)
        return compacted

    async def enforce_retention(self, *, batch: int = 100) -> int:
        """Delete archived sessions inactive for longer than `delete_after` (rows, transcripts
        and archives) through the lifecycle, as a transition logged with reason `retention`;
        how many were deleted."""
        if self.delete_after is None or self.admin is None:
            return 0
        cutoff = self.clock() - self.delete_after
        async with self.database.session() as db:
            expired = await AdminRepository(db).archived_before(cutoff, limit=batch)
        deleted = 0
        for session_id, user_id in expired:
            async with self.locks.hold(f"user:{user_id}") as held:
                if not held or not await self._still_expired(session_id, cutoff):
                    continue
                await self.admin.delete_session(session_id, reason="retention")
                log.info("retention.session_deleted", session_id=session_id, user_id=user_id)
                deleted += 1
        if deleted:
            log.info("retention.enforced", deleted=deleted, cutoff=cutoff.isoformat())
        return deleted

    async def _still_expired(self, session_id: str, cutoff: datetime) -> bool:
        # A message may have reactivated the session since it was selected.
        async with self.database.session() as db:
            session = await SessionRepository(db).get(session_id)
        return (
            session is not None
            and session.status == SessionStatus.ARCHIVED.value
            and session.last_active_at < cutoff
        )

    async def archive_idle_sessions(self) -> int:
        """Archive every active session idle longer than `archive_after`; how many were."""
        cutoff = self.clock() - self.archive_after
        async with self.database.session() as db:
            idle = await SessionRepository(db).idle_since(cutoff)
        archived = 0
        for candidate in idle:
            # The user's turn lock: a session is never archived in the middle of a turn.
            async with self.locks.hold(f"user:{candidate.user_id}") as held:
                if not held:
                    continue
                async with self.database.session() as db:
                    if await archive_session(
                        db, candidate.id, at=self.clock(), reason="idle", idle_before=cutoff
                    ):
                        archived += 1
        if archived:
            log.info("jobs.sessions_archived", count=archived)
        return archived
