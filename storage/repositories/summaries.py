"""Session summaries: written when sessions are archived, read back into later contexts."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from storage import driver_rows
from storage.models import Session, SessionStatus, SessionSummary
from storage.recall_entries import SUMMARY
from storage.recall_vectors import write_source_vectors

_RECENT = (
    "SELECT session_id, summary, created_at FROM session_summaries"
    " WHERE user_id = :user_id AND created_at >= :since ORDER BY created_at DESC LIMIT :limit"
)


async def send_recent_summaries(
    scope: driver_rows.DriverScope, user_id: str, *, since: datetime, limit: int
) -> driver_rows.Sent:
    """Read the user's newest summaries written since `since`, newest first, as rows of
    (session id, summary, written at); in a `driver_rows.pipelined` block without waiting.
    Through the driver: a context whose user's memory is not cached reads it (through the
    ORM, its two reads cost more than the rest of the turn's reads together)."""
    return await driver_rows.send(
        scope, _RECENT, {"user_id": user_id, "since": since, "limit": limit}, timestamps=(2,)
    )


class SummaryRepository:
    """Summaries written when sessions are archived."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(self, row: SessionSummary) -> None:
        """Store a session's summary (and its recall vector)."""
        self.session.add(row)
        await self.session.flush()
        await write_source_vectors(self.session, SUMMARY, [(row.id, row.summary)])

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
