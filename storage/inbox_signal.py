"""Waking turn workers: the accepting process says whose queue grew (PostgreSQL NOTIFY).

With `server.turn_workers`, one process accepts messages and others run the turns. A worker
finds all pending work by polling the inbox (once a second), which also recovers what a
crashed process left; a notification makes it start a user's turn at once instead. The
accepting process coalesces the senders of the messages it committed while a notification
was on its way into the next one (`InboxNotifier`), so a burst costs a few statements; each
worker keeps one connection listening (`inbox_listener`, a `storage.notifications.Listener`).
Both use psycopg directly, on autocommit connections of their own: a notification is one
round trip, outside any pool.

A lost notification (a worker reconnecting) costs at most the poll interval, never a message:
the inbox row is the record, the notification only a hint.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import psycopg
import structlog
from sqlalchemy.engine import URL

from storage.notifications import Listener, libpq_url

log = structlog.stdlib.get_logger(__name__)

CHANNEL = "gateway_inbox"
# PostgreSQL's payload limit is 8000 bytes; senders are joined by newlines under it.
MAX_PAYLOAD = 7900


def payloads(senders: list[str]) -> list[str]:
    """Senders joined by newlines into payloads under PostgreSQL's limit."""
    batches: list[str] = []
    current: list[str] = []
    size = 0
    for sender in senders:
        cost = len(sender.encode()) + 1
        if current and size + cost > MAX_PAYLOAD:
            batches.append("\n".join(current))
            current, size = [], 0
        current.append(sender)
        size += cost
    if current:
        batches.append("\n".join(current))
    return batches


class InboxNotifier:
    """Tells listening workers which senders have new messages, a batch per round trip."""

    def __init__(self, url: URL) -> None:
        self.url = libpq_url(url)
        self._pending: dict[str, None] = {}  # ordered set: oldest first
        self._flushing: asyncio.Task[None] | None = None
        self._connection: psycopg.AsyncConnection[tuple[object, ...]] | None = None

    def publish(self, sender: str) -> None:
        """Queue a notification for `sender` (sent at once, or with the batch after the one
        on its way)."""
        self._pending[sender] = None
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flush(), name="inbox-notify")

    async def _flush(self) -> None:
        while self._pending:
            senders = list(self._pending)
            self._pending.clear()
            try:
                connection = await self._connect()
                for payload in payloads(senders):
                    await connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
            except (psycopg.Error, OSError) as exc:
                # The workers' poll finds the messages anyway, a second later.
                log.warning("inbox.notify_failed", error=str(exc).splitlines()[0])
                await self._disconnect()
                return

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        if self._connection is None or self._connection.closed:
            self._connection = await psycopg.AsyncConnection.connect(
                self.url, autocommit=True, connect_timeout=5
            )
        return self._connection

    async def _disconnect(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await self._connection.close()
            self._connection = None

    async def close(self) -> None:
        """Send what is queued, then close the connection."""
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)
        await self._disconnect()


def inbox_listener(url: URL, on_sender: Callable[[str | None], None]) -> Listener:
    """Calls `on_sender(sender)` for every sender the accepting process announces, and
    `on_sender(None)` after (re)connecting, when announcements may have been missed."""
    return Listener(url, CHANNEL, on_sender)
