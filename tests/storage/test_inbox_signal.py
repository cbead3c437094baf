"""New messages announced to the turn workers (PostgreSQL): the inbox's INSERT notifies the
senders of the rows it committed, in the same statement, each on its worker's channel, and
nothing for duplicates; a worker's poll leaves the other workers' senders to them until
their events have waited."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import text

from errors import StorageError
from storage.database import Database
from storage.inbox_signal import WorkerShare, inbox_listener, share_channel, share_of
from storage.notifications import libpq_url
from storage.repositories.inbox import InboxRepository, NewInboundEvent, accept_events
from tests.storage.listening import running, until

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
ONLY_WORKER = WorkerShare(0, 1)


def event(message_id: str, sender: str) -> NewInboundEvent:
    return NewInboundEvent("web", message_id, sender, T0, {"content": message_id}, {})


@contextlib.asynccontextmanager
async def heard_by_a_worker(
    database: Database, share: WorkerShare = ONLY_WORKER
) -> AsyncIterator[list[str | None]]:
    """What a turn worker's listener hears, in order (None: it connected)."""
    heard: list[str | None] = []
    async with running(inbox_listener(database.url, heard.append, share), heard):
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
            await listener.execute(f"LISTEN {share_channel(0)}")
            # A sender key past its column's 400 characters: the statement fails.
            too_long = event("m9", "web:" + "x" * 500)
            with pytest.raises(StorageError, match="value too long"):
                await accept(database, [event("m8", "web:carol"), too_long])
            await listener.execute("SELECT 1")  # a round trip: anything sent has arrived
            assert [n async for n in _pending(listener)] == []
    finally:
        await database.dispose()


async def test_each_sender_is_announced_to_its_own_worker_only(migrated_postgres_url: str) -> None:
    database = Database(migrated_postgres_url)
    senders = [f"web:user{n}" for n in range(40)]
    try:
        async with (
            heard_by_a_worker(database, WorkerShare(0, 2)) as first,
            heard_by_a_worker(database, WorkerShare(1, 2)) as second,
        ):
            events = [event(f"m{n}", sender) for n, sender in enumerate(senders)]
            assert None not in await accept(database, events, workers=2)
            await until(lambda: len(first) + len(second) == 2 + len(senders))
        shares = await _shares(database, senders, 2)
        assert first[1:] == [sender for sender in senders if shares[sender] == 0]
        assert second[1:] == [sender for sender in senders if shares[sender] == 1]
        assert first[1:]
        assert second[1:]  # 40 keys: both shares have some
    finally:
        await database.dispose()


async def test_a_workers_poll_takes_another_workers_senders_only_once_they_waited(
    migrated_postgres_url: str,
) -> None:
    database = Database(migrated_postgres_url)
    senders = [f"web:user{n}" for n in range(20)]
    try:
        await accept(database, [event(f"m{n}", s) for n, s in enumerate(senders)], workers=2)
        shares = await _shares(database, senders, 2)
        async with database.single() as db:
            inbox = InboxRepository(db)
            fresh = T0 - timedelta(seconds=10)  # every event arrived after this
            late = T0 + timedelta(seconds=1)  # and all of them before this
            for index in (0, 1):
                share = WorkerShare(index, 2)
                own = [sender for sender in senders if shares[sender] == index]
                assert await inbox.pending_senders(share=share, before=fresh) == own
                assert await inbox.pending_senders(share=share, before=late) == senders
            # One worker (or none: a process that runs every turn itself) polls everything.
            assert await inbox.pending_senders(share=WorkerShare(0, 1), before=fresh) == senders
            assert await inbox.pending_senders() == senders
    finally:
        await database.dispose()


async def accept(
    database: Database, events: list[NewInboundEvent], *, workers: int = 1
) -> list[int | None]:
    async with database.statement(writes=True, accepting=True) as scope:
        return await accept_events(scope, events, announce=workers)


async def _shares(database: Database, senders: list[str], count: int) -> dict[str, int]:
    """Each sender's worker, as PostgreSQL computes it."""
    async with database.session() as db:
        found = await db.execute(
            text(f"SELECT key, {share_of('key', count)} FROM unnest(CAST(:keys AS text[])) AS key"),
            {"keys": senders},
        )
        return {key: int(share) for key, share in found}


async def _pending(connection: psycopg.AsyncConnection[tuple[object, ...]]) -> AsyncIterator[str]:
    """The notifications already received, without waiting for more."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.3):
            async for notification in connection.notifies():
                yield notification.payload
