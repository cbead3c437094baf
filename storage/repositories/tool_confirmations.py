"""Tool calls waiting for their user's yes (`ToolConfirmation`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession

from storage import driver_rows
from storage.models import ToolConfirmation


@dataclass(frozen=True, slots=True)
class WaitingCall:
    """A session's call waiting for its user's yes, as read."""

    user_id: str
    tool_name: str
    tool_input: Mapping[str, Any]
    question: str
    expires_at: datetime


_WAITING = """SELECT user_id, tool_name, tool_input, question, expires_at
    FROM tool_confirmations WHERE session_id = :session_id"""


async def read_waiting(scope: driver_rows.DriverScope, session_id: str) -> WaitingCall | None:
    """The call waiting in this session, if any (expired ones included: the turn says so).
    A turn reads it whenever another process may have asked for one (replicas behind a load
    balancer: most messages), so through the driver, as the turn's other reads."""
    found = await driver_rows.rows(scope, _WAITING, {"session_id": session_id}, timestamps=(4,))
    if not found:
        return None
    user_id, tool_name, tool_input, question, expires_at = found[0]
    return WaitingCall(
        user_id, tool_name, driver_rows.json_value(tool_input) or {}, question, expires_at
    )


class ToolConfirmationRepository:
    """One waiting call per session at most."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

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
