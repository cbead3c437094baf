"""Turn locks on PostgreSQL: one holder per key across processes, all of a process's locks on
one connection, and locks taken back after that connection is lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from structlog.testing import capture_logs

from gateway.locks import LocalTurnLocks, PostgresTurnLocks
from storage.database import Database


@pytest.fixture
async def databases(postgres_url: str) -> AsyncIterator[tuple[Database, Database]]:
    """Two engines on one database: two gateway processes, as far as locks can tell."""
    first, second = Database(postgres_url), Database(postgres_url)
    yield first, second
    await first.dispose()
    await second.dispose()


async def lock_backend_pids(database: Database) -> list[int]:
    """The server processes of connections holding advisory locks."""
    async with database.engine.connect() as connection:
        result = await connection.execute(
            text(
                "SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                " WHERE l.locktype = 'advisory' AND d.datname = current_database()"
            )
        )
        return [int(pid) for pid in result.scalars()]


async def test_a_key_has_one_holder_across_processes(
    databases: tuple[Database, Database],
) -> None:
    one, other = PostgresTurnLocks(databases[0]), PostgresTurnLocks(databases[1])
    async with one.hold("user:alice") as held:
        assert held
        async with other.hold("user:alice") as taken_elsewhere, one.hold("user:alice") as again:
            assert not taken_elsewhere
            assert not again  # a second task of the same process
        async with other.hold("user:bob") as bob:
            assert bob
    async with other.hold("user:alice") as after_release:
        assert after_release
    await one.close()
    await other.close()


async def test_every_lock_of_a_process_is_held_on_one_connection(
    databases: tuple[Database, Database],
) -> None:
    locks = PostgresTurnLocks(databases[0])
    entered = asyncio.Event()
    release = asyncio.Event()
    holding = 0

    async def hold(key: str) -> None:
        nonlocal holding
        async with locks.hold(key) as held:
            assert held
            holding += 1
            if holding == 50:
                entered.set()
            await release.wait()

    tasks = [asyncio.create_task(hold(f"user:{n}")) for n in range(50)]
    await asyncio.wait_for(entered.wait(), timeout=10)
    assert len(await lock_backend_pids(databases[1])) == 1
    assert databases[0].engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    release.set()
    await asyncio.gather(*tasks)
    assert await lock_backend_pids(databases[1]) == []
    await locks.close()


async def test_locks_are_taken_back_after_the_lock_connection_is_lost(
    databases: tuple[Database, Database],
) -> None:
    one, other = PostgresTurnLocks(databases[0]), PostgresTurnLocks(databases[1])
    async with one.hold("user:alice") as alice, one.hold("user:carol") as carol:
        assert alice
        assert carol
        (pid,) = await lock_backend_pids(databases[1])
        async with databases[1].engine.connect() as connection:
            await connection.execute(text(f"SELECT pg_terminate_backend({pid})"))
            await connection.commit()
        # Meanwhile the server released both; another process takes Carol's key.
        async with other.hold("user:carol") as carol_elsewhere:
            assert carol_elsewhere
            with capture_logs() as logged:
                # The next lock call of the first process reconnects and takes back what it
                # still holds: Alice's key, not Carol's (held elsewhere now).
                async with one.hold("user:dave") as dave:
                    assert dave
        async with other.hold("user:alice") as alice_elsewhere:
            assert not alice_elsewhere
    events = [(entry["event"], entry.get("key")) for entry in logged]
    assert ("turn_lock.lost", "user:carol") in events
    assert ("turn_lock.lost", "user:alice") not in events
    async with other.hold("user:alice") as released_at_the_end:
        assert released_at_the_end
    await one.close()
    await other.close()


async def test_local_locks_refuse_a_second_holder() -> None:
    locks = LocalTurnLocks()
    async with locks.hold("user:alice") as first, locks.hold("user:alice") as second:
        assert first
        assert not second
    async with locks.hold("user:alice") as again:
        assert again
    await locks.close()
