"""Serving `/export` download links: a valid, unexpired token gives that one session's data."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from gateway.commands import export_token_hash
from gateway.log import get_logger
from sessions.export import export_session
from storage.database import Database
from storage.repositories.export_links import ExportLinkRepository
from storage.repositories.sessions import SessionRepository

log = get_logger(__name__)


class SessionExports:
    """Reads the export a link points to (the web channel serves it)."""

    def __init__(self, database: Database, clock: Callable[[], datetime]) -> None:
        self.database = database
        self.clock = clock

    async def export(self, token: str) -> dict[str, Any] | None:
        """The export behind `token`, or None when the link is unknown or expired."""
        async with self.database.session() as db:
            link = await ExportLinkRepository(db).valid(export_token_hash(token), now=self.clock())
            if link is None:
                return None
            session = await SessionRepository(db).get(link.session_id)
            if session is None or session.user_id != link.user_id:
                return None
            data = await export_session(db, session)
        log.info("export.downloaded", session_id=link.session_id, user_id=link.user_id)
        return data
