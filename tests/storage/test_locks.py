"""Turn locks on PostgreSQL: one holder per key across processes, all of a process's locks on
one connection, calls that queue up run as one statement, and locks taken back after that
connection is lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection
from structlog.testing import capture_logs

from storage import driver_rows
from storage import locks as locks_module
from storage.database import Database
from storage.driver_rows import LentConnection
from storage.locks import LocalTurnLocks, LockAnswer, LockCall, PostgresTurnLocks


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


async def terminate_backend(database: Database, pid: int) -> None:
    """End a server process and wait until it is gone (and its locks with it):
    `pg_terminate_backend` only sends the signal."""
    async with database.engine.connect() as connection:
        await connection.execute(text(f"SELECT pg_terminate_backend({pid})"))
        await connection.commit()
        async with asyncio.timeout(10):
            # One transaction per look: the activity view is a snapshot within a transaction.
            while await connection.scalar(
                text(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}")
            ):
                await connection.commit()
                await asyncio.sleep(0.01)
            await connection.commit()


@contextmanager
def lock_statements(
    database: Database, sent: Callable[[], None] = lambda: None
) -> Iterator[list[str]]:
    """The statements that take or release advisory locks on the database's engine, each as
    its calls (`take`, `release`), recorded as it is sent (`sent` is called then). The lock
    statement goes through the driver, which SQLAlchemy's events do not see."""
    seen: list[str] = []
    real_execute = locks_module._execute

    async def recorded(connection: AsyncConnection, calls: list[LockCall]) -> list[LockAnswer]:
        if calls and connection.engine.sync_engine is database.engine.sync_engine:
            seen.append(" ".join("take" if call.take else "release" for call in calls))
            sent()
        return await real_execute(connection, calls)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(locks_module, "_execute", recorded)
        yield seen


async def wait_until_free(locks: PostgresTurnLocks, key: str) -> None:
    async with asyncio.timeout(10):
        while True:
            async with locks.hold(key) as held:
                if held:
                    return
            await asyncio.sleep(0.01)


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
        await terminate_backend(databases[1], pid)
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


async def test_holds_that_start_and_end_together_cost_one_statement_each_way(
    databases: tuple[Database, Database],
) -> None:
    locks, other = PostgresTurnLocks(databases[0]), PostgresTurnLocks(databases[1])
    holding = 0
    entered, release = asyncio.Event(), asyncio.Event()
    outcomes: list[bool] = []

    async def hold(key: str) -> None:
        nonlocal holding
        async with locks.hold(key) as held:
            outcomes.append(held)
            holding += 1
            if holding == 100:
                entered.set()
            await release.wait()

    with lock_statements(databases[0]) as statements:
        tasks = [asyncio.create_task(hold(f"user:{n}")) for n in range(100)]
        await asyncio.wait_for(entered.wait(), timeout=10)
        taken = len(statements)
        for n in (0, 57, 99):
            async with other.hold(f"user:{n}") as elsewhere:
                assert not elsewhere
        release.set()
        await asyncio.gather(*tasks)

    assert outcomes == [True] * 100
    # 100 locks and 100 releases: one statement per call before grouping, 200 in all.
    assert taken == 1
    assert statements == [" ".join(["take"] * 100), " ".join(["release"] * 100)]
    assert await lock_backend_pids(databases[1]) == []
    await locks.close()
    await other.close()


async def test_each_holder_in_a_shared_statement_gets_its_own_answer(
    databases: tuple[Database, Database],
) -> None:
    one, other = PostgresTurnLocks(databases[0]), PostgresTurnLocks(databases[1])
    async with other.hold("user:bob") as bob_elsewhere:
        assert bob_elsewhere
        async with one.hold("user:alice") as alice:
            assert alice
            results = []

            async def take(key: str) -> None:
                async with one.hold(key) as held:
                    results.append((key, held))

            with lock_statements(databases[0]) as statements:
                await asyncio.gather(take("user:bob"), take("user:dave"), take("user:alice"))
        # Bob's and Dave's in one statement (and their releases in one more); Alice is
        # refused in this process without asking the server.
        assert sorted(results) == [("user:alice", False), ("user:bob", False), ("user:dave", True)]
        assert statements == ["take take", "release"]
    await one.close()
    await other.close()


async def test_a_lock_taken_for_a_cancelled_holder_is_released(
    databases: tuple[Database, Database],
) -> None:
    one, other = PostgresTurnLocks(databases[0]), PostgresTurnLocks(databases[1])
    in_flight = asyncio.Event()

    async def hold_forever(key: str) -> None:
        async with one.hold(key):
            await asyncio.Event().wait()

    with lock_statements(databases[0], sent=in_flight.set):
        cancelled = asyncio.create_task(hold_forever("user:alice"))
        kept = asyncio.create_task(hold_forever("user:bob"))
        await asyncio.wait_for(in_flight.wait(), timeout=10)
        cancelled.cancel()  # while the statement taking its lock (and Bob's) runs
        with pytest.raises(asyncio.CancelledError):
            await cancelled

    await wait_until_free(other, "user:alice")
    async with other.hold("user:bob") as bob_elsewhere:
        assert not bob_elsewhere
    kept.cancel()
    with pytest.raises(asyncio.CancelledError):
        await kept
    await wait_until_free(other, "user:bob")
    await one.close()
    await other.close()


async def backend_pid(scope: LentConnection) -> driver_rows.Sent:
    """A first read: the server process it runs on."""
    return await driver_rows.send(scope, "SELECT pg_backend_pid()", {})


async def dividing_by_zero(scope: LentConnection) -> driver_rows.Sent:
    """A first read the server refuses."""
    return await driver_rows.send(scope, "SELECT 1 / CAST(:zero AS integer)", {"zero": 0})


async def test_a_first_read_goes_with_its_take_on_the_lock_connection(
    databases: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, other = PostgresTurnLocks(databases[0]), PostgresTurnLocks(databases[1])
    # The pipeline's end is its one wait: no Sync of its own before it (a round trip more).
    syncs: list[object] = []
    sync = psycopg.AsyncPipeline.sync

    async def counted(pipeline: psycopg.AsyncPipeline) -> None:
        syncs.append(pipeline)
        await sync(pipeline)

    monkeypatch.setattr(psycopg.AsyncPipeline, "sync", counted)
    with lock_statements(databases[0]) as statements:
        async with one.hold_reading("user:alice", backend_pid) as alice:
            assert alice
            assert alice.first is not None
            # Read where the lock is held, in the statement's round trip: its answer is in.
            assert alice.first._cursor is not None
            assert alice.first._cursor.pgresult is not None
            assert await alice.first.rows() == [
                (pid,) for pid in await lock_backend_pids(one.database)
            ]
            async with other.hold_reading("user:alice", backend_pid) as elsewhere:
                assert not elsewhere
                assert elsewhere.first is None  # sent, then dropped: the key is not this one's
    assert statements == ["take", "release"]
    assert syncs == []
    await one.close()
    await other.close()


@pytest.mark.parametrize("surfacing", ["at the block's end", "at the next read's send"])
async def test_a_failed_first_read_leaves_the_locks_of_its_round_trip_held(
    databases: tuple[Database, Database], surfacing: str
) -> None:
    one, other = PostgresTurnLocks(databases[0]), PostgresTurnLocks(databases[1])

    async def refused(scope: LentConnection) -> driver_rows.Sent:
        sent = await dividing_by_zero(scope)
        if surfacing != "at the block's end":
            await asyncio.sleep(0.3)  # the error comes in before the next read is sent
        return sent

    async with one.hold("user:dave") as dave:
        assert dave
        (pid,) = await lock_backend_pids(databases[1])
        release = asyncio.Event()
        held: list[tuple[str, bool, object]] = []

        async def hold(key: str, first: locks_module.FirstRead[driver_rows.Sent]) -> None:
            async with one.hold_reading(key, first) as taken:
                held.append((key, taken.taken, taken.first))
                await release.wait()

        with capture_logs() as logged, lock_statements(databases[0]) as statements:
            tasks = [
                asyncio.create_task(hold("user:alice", backend_pid)),
                asyncio.create_task(hold("user:bob", refused)),
                asyncio.create_task(hold("user:carol", backend_pid)),
            ]
            async with asyncio.timeout(10):
                while len(held) < 3:
                    await asyncio.sleep(0.01)
            # One round trip took all three; the refused read aborted the reads after it
            # and lost none of the locks: every holder reads by itself.
            assert statements == ["take take take"]
            assert sorted(held) == [
                ("user:alice", True, None),
                ("user:bob", True, None),
                ("user:carol", True, None),
            ]
            for key in ("user:alice", "user:bob", "user:carol", "user:dave"):
                async with other.hold(key) as elsewhere:
                    assert not elsewhere
            release.set()
            await asyncio.gather(*tasks)
        assert [entry["event"] for entry in logged] == ["turn_lock.first_read_failed"]
        assert "division by zero" in logged[0]["error"]
        # The same connection still holds Dave's lock and answers the next read.
        async with one.hold_reading("user:erin", backend_pid) as erin:
            assert erin.first is not None
            assert await erin.first.rows() == [(pid,)]
    await one.close()
    await other.close()


async def test_local_locks_leave_the_first_read_to_the_holder() -> None:
    locks = LocalTurnLocks()

    async def never(scope: LentConnection) -> None:
        raise AssertionError("a local lock has no connection to read on")

    async with (
        locks.hold_reading("user:alice", never) as alice,
        locks.hold_reading("user:alice", never) as again,
    ):
        assert (alice.taken, alice.first) == (True, None)
        assert not again
    await locks.close()
