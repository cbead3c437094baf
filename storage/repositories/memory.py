"""Memory: the durable facts remembered about each user."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from storage import driver_rows
from storage.models import UserMemoryFact
from storage.repositories._sql import dialect_insert

_FACT_TEXTS = (
    "SELECT fact FROM user_memory_facts WHERE user_id = :user_id"
    " ORDER BY created_at DESC, id DESC LIMIT :limit"
)


async def send_fact_texts(
    scope: driver_rows.DriverScope, user_id: str, *, limit: int
) -> driver_rows.Sent:
    """Read the texts of the user's newest facts, newest first (rows of one column); in a
    `driver_rows.pipelined` block without waiting (see `send_recent_summaries`)."""
    return await driver_rows.send(scope, _FACT_TEXTS, {"user_id": user_id, "limit": limit})


class MemoryRepository:
    """Durable facts about users."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def remember(
        self,
        user_id: str,
        *,
        fact_key: str,
        fact: str,
        category: str,
        source_session_id: str | None,
        at: datetime,
    ) -> bool:
        """Store a fact unless the user already has one with the same key; True if new."""
        statement = (
            dialect_insert(self.session, UserMemoryFact)
            .values(
                user_id=user_id,
                fact_key=fact_key,
                fact=fact,
                category=category,
                source_session_id=source_session_id,
                created_at=at,
                updated_at=at,
            )
            .on_conflict_do_nothing(index_elements=["user_id", "fact_key"])
            .returning(UserMemoryFact.id)
        )
        result = await self.session.execute(statement)
        return result.scalar_one_or_none() is not None

    async def facts(self, user_id: str, *, limit: int = 200) -> list[UserMemoryFact]:
        """The user's facts, newest first."""
        result = await self.session.execute(
            select(UserMemoryFact)
            .where(UserMemoryFact.user_id == user_id)
            .order_by(UserMemoryFact.created_at.desc(), UserMemoryFact.id.desc())
            .limit(limit)
        )
        return list(result.scalars())
