"""New messages announced to the turn workers (PostgreSQL): the inbox's INSERT notifies the
senders of the rows it committed, in the same statement, and nothing for duplicates."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import psycopg
import pytest

from errors import StorageError
from storage.database import Database
from storage.inbox_signal import CHANNEL, inbox_listener
from storage.notifications import libpq_url
from storage.repositories.inbox import NewInboundEvent, accept_events
from tests.storage.listening import running, until

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def event(message_id: str, sender: str) -> NewInboundEvent:
    return NewInboundEvent("web", message_id, sender, T0, {"content": message_id}, {})


@contextlib.asynccontextmanager
async def heard_by_a_worker(database: Database) -> AsyncIterator[list[str | None]]:
    """What a turn worker's listener hears, in order (None: it connected)."""
    heard: list[str | None] = []
    async with running(inbox_listener(database.url, heard.append), heard):
        yield heard


async def test_the_insert_announces_the_new_rows_senders_when_it_commits(
    migrated_postgres_url: str,
) -> None:
    database = Database(migrated_postgres_url)
    try:
        async with heard_by_a_worker(database) as heard:
            alice_bob = [event("m1", "web:alice"), event("m2", "web:bob"), event("m3", "web:alice")]
            assert None not in await accept(database, alice_bob)
            await until(lambda: len(heard) == 3)
            assert heard == [None, "web:alice", "web:bob"]  # each sender once, oldest first
            # Duplicates only: nothing new, nobody told.
            assert await accept(database, [event("m1", "web:alice")]) == [None]
            # Many senders with the longest keys a sender may have: split into notifications
            # under PostgreSQL's payload limit, every one of them told.
            senders = [f"web:{n:03d}" + "x" * 392 for n in range(50)]
            await accept(database, [event(f"n{n}", sender) for n, sender in enumerate(senders)])
            await until(lambda: len(heard) == 3 + len(senders))
            assert heard[3:] == senders
            # And the longest in bytes: 400 characters of four bytes each (an address may be
            # written in any script), a notification's limit being bytes.
            wide = [f"web:{n:03d}" + "\N{GRINNING FACE}" * 392 for n in range(20)]
            await accept(database, [event(f"w{n}", sender) for n, sender in enumerate(wide)])
            await until(lambda: len(heard) == 3 + len(senders) + len(wide))
            assert heard[3 + len(senders) :] == wide
    finally:
        await database.dispose()


async def test_an_insert_that_fails_announces_nothing(migrated_postgres_url: str) -> None:
    database = Database(migrated_postgres_url)
    try:
        listener = await psycopg.AsyncConnection.connect(libpq_url(database.url), autocommit=True)
        async with listener:
            await listener.execute(f"LISTEN {CHANNEL}")
            # A sender key past its column's 400 characters: the statement fails.
            too_long = event("m9", "web:" + "x" * 500)
            with pytest.raises(StorageError, match="value too long"):
                await accept(database, [event("m8", "web:carol"), too_long])
            await listener.execute("SELECT 1")  # a round trip: anything sent has arrived
            assert [n async for n in _pending(listener)] == []
    finally:
        await database.dispose()


async def accept(database: Database, events: list[NewInboundEvent]) -> list[int | None]:
    async with database.statement(writes=True, accepting=True) as scope:
        return await accept_events(scope, events, announce=True)


async def _pending(connection: psycopg.AsyncConnection[tuple[object, ...]]) -> AsyncIterator[str]:
    """The notifications already received, without waiting for more."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.3):
            async for notification in connection.notifies():
                yield notification.payload
