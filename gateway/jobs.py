"""Background jobs, run by one leader at a time across every gateway process.

Leadership is a lease row in the database, renewed on every run; when the leader dies its
lease expires and another process takes over. The jobs: archive sessions idle longer than
`sessions.archive_after`, retry compactions that had to wait, write the summaries (and
memory facts) of archived sessions, delete archived sessions past
`retention.delete_after_days`, and on SQLite keep the recall index's full-text segments merged.
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
from storage.recall_index import RecallIndexRepository, merge_full_text
from storage.repositories.admin import AdminRepository
from storage.repositories.leases import LeaseRepository
from storage.repositories.sessions import SessionRepository

log = get_logger(__name__)

LEASE_NAME = "background-jobs"
MERGE_AFTER_ENTRIES = 2_000
"""Recall entries written since the last merge of the full-text index (SQLite) before the
next: at least this many, and at least a twentieth of the index."""


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
        # The largest recall entry id at the last full-text merge (None: not merged yet).
        self._merged_up_to: int | None = None
        self.passes = 0
        """Passes of `run` ended so far, led or not."""

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
                    await self.merge_recall_index()
            except (GatewayError, OSError) as exc:
                log.error("jobs.failed", error=str(exc).splitlines()[0])
            self.passes += 1
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

    async def merge_recall_index(self) -> int:
        """SQLite: merge the recall index's full-text segments into one when enough was
        written since the last merge (`MERGE_AFTER_ENTRIES`, or a twentieth of the index),
        and once after start; the merge steps taken. A merged index is searched several times
        faster (every segment costs each searched word a seek), and the merge rewrites the
        index, so it waits until the index has grown by a share of itself."""
        if not self.database.is_sqlite:
            return 0
        async with self.database.single() as db:
            latest = await RecallIndexRepository(db).latest_id()
        merged_up_to = self._merged_up_to
        if merged_up_to is not None and latest - merged_up_to < max(
            MERGE_AFTER_ENTRIES, merged_up_to // 20
        ):
            return 0
        steps = await merge_full_text(self.database)
        self._merged_up_to = latest
        if steps:
            log.info("jobs.recall_index_merged", steps=steps, entries_up_to=latest)
        return steps

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
