"""Session summaries: written when sessions are archived, read back into later contexts."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import Session, SessionStatus, SessionSummary
from storage.recall_entries import SUMMARY
from storage.recall_vectors import write_source_vectors


class SummaryRepository:
    """Summaries written when sessions are archived."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(self, row: SessionSummary) -> None:
        """Store a session's summary (and its recall vector)."""
        self.session.add(row)
        await self.session.flush()
        await write_source_vectors(self.session, SUMMARY, [(row.id, row.summary)])

    async def recent(
        self, user_id: str, *, since: datetime, exclude_session_id: str | None, limit: int
    ) -> list[SessionSummary]:
        """The user's newest summaries written since `since`, newest first."""
        statement = select(SessionSummary).where(
            SessionSummary.user_id == user_id, SessionSummary.created_at >= since
        )
        if exclude_session_id is not None:
            statement = statement.where(SessionSummary.session_id != exclude_session_id)
        result = await self.session.execute(
            statement.order_by(SessionSummary.created_at.desc()).limit(limit)
        )
        return list(result.scalars())

    async def archived_without_summary(
        self, *, min_user_messages: int, limit: int = 20
    ) -> list[Session]:
        """Archived sessions long enough to summarise that have no summary yet."""
        summarised = select(SessionSummary.session_id)
        result = await self.session.execute(
            select(Session)
            .where(
                Session.status == SessionStatus.ARCHIVED.value,
                Session.user_message_count >= min_user_messages,
                Session.id.not_in(summarised),
            )
            .order_by(Session.archived_at)
            .limit(limit)
        )
        return list(result.scalars())
