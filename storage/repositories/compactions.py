"""Compactions of sessions: what each one replaced, in order."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import SessionCompaction
from storage.recall_entries import COMPACTION
from storage.recall_vectors import write_source_vectors


class CompactionRepository:
    """Compactions of sessions."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def latest(self, session_id: str) -> SessionCompaction | None:
        """The session's most recent compaction, or None."""
        result = await self.session.execute(
            select(SessionCompaction)
            .where(SessionCompaction.session_id == session_id)
            .order_by(SessionCompaction.seq.desc())
            .limit(1)
        )
        return result.scalar_one_or_none()

    async def add(self, row: SessionCompaction) -> None:
        """Record a finished compaction (and its summary's recall vector)."""
        self.session.add(row)
        await self.session.flush()
        await write_source_vectors(self.session, COMPACTION, [(row.id, row.summary)])

    async def all_of(self, session_id: str) -> list[SessionCompaction]:
        """All compactions of the session, oldest first."""
        result = await self.session.execute(
            select(SessionCompaction)
            .where(SessionCompaction.session_id == session_id)
            .order_by(SessionCompaction.seq)
        )
        return list(result.scalars())
