"""Export links: expiring downloads of a session's export, stored by the hash of their token."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import ExportLink


class ExportLinkRepository:
    """Expiring download links for session exports."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def create(
        self, token_hash: str, *, user_id: str, session_id: str, at: datetime, expires_at: datetime
    ) -> None:
        """Store a link (by the hash of its token)."""
        self.session.add(
            ExportLink(
                token_hash=token_hash,
                user_id=user_id,
                session_id=session_id,
                created_at=at,
                expires_at=expires_at,
            )
        )
        await self.session.flush()

    async def valid(self, token_hash: str, *, now: datetime) -> ExportLink | None:
        """The link with this token hash, if it has not expired."""
        link = await self.session.get(ExportLink, token_hash)
        return link if link is not None and link.expires_at > now else None
