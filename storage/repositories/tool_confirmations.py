"""Tool calls waiting for their user's yes (`ToolConfirmation`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import ToolConfirmation


class ToolConfirmationRepository:
    """One waiting call per session at most."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def waiting(self, session_id: str) -> ToolConfirmation | None:
        """The call waiting in this session, if any (expired ones included: the turn says so)."""
        return await self.session.get(ToolConfirmation, session_id)

    async def ask(
        self,
        session_id: str,
        user_id: str,
        *,
        tool_name: str,
        tool_input: Mapping[str, Any],
        question: str,
        at: datetime,
        expires_at: datetime,
    ) -> None:
        """Store a call that waits for the user's yes (replacing any earlier one)."""
        await self.resolve(session_id)
        self.session.add(
            ToolConfirmation(
                session_id=session_id,
                user_id=user_id,
                tool_name=tool_name,
                tool_input=dict(tool_input),
                question=question,
                created_at=at,
                expires_at=expires_at,
            )
        )
        await self.session.flush()

    async def resolve(self, session_id: str) -> None:
        """The waiting call was answered (run or not): forget it."""
        await self.session.execute(
            delete(ToolConfirmation).where(ToolConfirmation.session_id == session_id)
        )
