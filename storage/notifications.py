"""Listening to PostgreSQL notifications (LISTEN) on a connection of one's own.

The inbox's news for turn workers (`storage.inbox_signal`) and users' memory changes
(`storage.memory_signal`) arrive this way. A notification is a hint, never the record: after
a lost connection the listener says so (`on_lost`) and, back, that some may have been missed
(`on_item(None)`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import structlog
from sqlalchemy.engine import URL

log = structlog.stdlib.get_logger(__name__)

RECONNECT_DELAY = 1.0


def libpq_url(url: URL) -> str:
    """The SQLAlchemy URL as psycopg connects to it."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class Listener:
    """Calls `on_item(item)` for every newline-separated item notified on `channel`,
    `on_item(None)` after (re)connecting, when notifications may have been missed, and
    `on_lost()` (if given) when the connection is lost or cannot be made. One connection of
    its own, kept open and reconnected after a loss."""

    def __init__(
        self,
        url: URL,
        channel: str,
        on_item: Callable[[str | None], None],
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.url = libpq_url(url)
        self.channel = channel
        self.on_item = on_item
        self.on_lost = on_lost

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after a lost connection."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=5
                ) as connection:
                    await connection.execute(f"LISTEN {self.channel}")
                    log.info("notifications.listening", channel=self.channel)
                    self.on_item(None)
                    async for notification in connection.notifies():
                        for item in notification.payload.split("\n"):
                            if item:
                                self.on_item(item)
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "notifications.listen_failed",
                    channel=self.channel,
                    error=str(exc).splitlines()[0],
                )
                if self.on_lost is not None:
                    self.on_lost()
            await asyncio.sleep(RECONNECT_DELAY)
