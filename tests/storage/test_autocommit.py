"""`Database.statement` on PostgreSQL: autocommit connections lent one block at a time, kept
for the next block, never more at once than there are, and dropped when the server has gone
away under them (the statement that meets that fails once, the next one reconnects)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage import driver_rows
from storage.database import LENT_CONNECTIONS, Database


@pytest.fixture
async def database(fresh_postgres_url: str) -> AsyncIterator[Database]:
    database = Database(fresh_postgres_url, pool_size=2)
    yield database
    await database.dispose()


async def backend_pid(database: Database) -> int:
    async with database.statement(writes=False) as scope:
        ((pid,),) = await driver_rows.rows(scope, "SELECT pg_backend_pid()", {})
    return int(pid)


async def test_a_statement_commits_by_itself_on_a_connection_kept_for_the_next(
    database: Database,
) -> None:
    async with database.session() as db:
        await db.execute(text("CREATE TABLE notes (body text)"))
    first = await backend_pid(database)

    async with database.statement(writes=True) as scope:
        await driver_rows.rows(scope, "INSERT INTO notes VALUES (:body)", {"body": "one"})
        # Committed already: another connection sees it while the block still runs.
        async with database.session() as db:
            assert list((await db.execute(text("SELECT body FROM notes"))).scalars()) == ["one"]

    assert await backend_pid(database) == first


async def test_no_more_connections_are_lent_at_once_than_there_are(database: Database) -> None:
    inside, most = 0, 0
    pids: set[int] = set()

    async def one() -> None:
        nonlocal inside, most
        async with database.statement(writes=False) as scope:
            inside += 1
            most = max(most, inside)
            ((pid,),) = await driver_rows.rows(
                scope, "SELECT pg_backend_pid() FROM pg_sleep(0.02)", {}
            )
            pids.add(pid)
            inside -= 1

    await asyncio.gather(*(one() for _ in range(LENT_CONNECTIONS * 3)))

    assert most == LENT_CONNECTIONS
    assert len(pids) == LENT_CONNECTIONS


async def test_accepting_never_waits_behind_the_other_statements(database: Database) -> None:
    """With every connection for the other statements lent, the inbox's still runs at once,
    on its own connection."""
    async with contextlib.AsyncExitStack() as busy:
        others = [
            await busy.enter_async_context(database.statement(writes=False))
            for _ in range(LENT_CONNECTIONS)
        ]
        async with asyncio.timeout(2), database.statement(writes=True, accepting=True) as scope:
            ((pid,),) = await driver_rows.rows(scope, "SELECT pg_backend_pid()", {})
        busy_pids = set()
        for other in others:
            ((other_pid,),) = await driver_rows.rows(other, "SELECT pg_backend_pid()", {})
            busy_pids.add(other_pid)
        assert pid not in busy_pids
        with pytest.raises(TimeoutError):  # the others' lender is full meanwhile
            async with asyncio.timeout(0.2), database.statement(writes=False):
                pass


async def test_a_connection_the_server_dropped_fails_once_then_a_new_one_is_used(
    database: Database,
) -> None:
    # Two connections idle, as after a burst: a restart ends both.
    pids: list[int] = []
    async with (
        database.statement(writes=False) as first,
        database.statement(writes=False) as second,
    ):
        for scope in (first, second):
            ((pid,),) = await driver_rows.rows(scope, "SELECT pg_backend_pid()", {})
            pids.append(pid)
    async with database.session() as db:
        for pid in pids:
            await db.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    with pytest.raises(StorageError, match="database error"):
        await backend_pid(database)
    # Every idle connection went with the broken one: the next statement connects anew.
    again = await backend_pid(database)

    assert again not in pids
    assert await backend_pid(database) == again


async def test_a_connection_given_back_inside_a_transaction_is_not_lent_again(
    database: Database,
) -> None:
    async with database.statement(writes=True) as scope:
        ((pid,),) = await driver_rows.rows(scope, "SELECT pg_backend_pid()", {})
        await driver_rows.rows(scope, "BEGIN", {})

    assert await backend_pid(database) != pid
    # Not left open at the server either: the dropped connection was closed (its backend
    # may take a moment to go; each look is a transaction of its own, since
    # `pg_stat_activity` is read once a transaction).
    for _ in range(100):
        async with database.session() as db:
            alive = await db.scalar(
                text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            )
        if not alive:
            break
        await asyncio.sleep(0.01)
    assert not alive


async def test_on_sqlite_the_scope_is_a_session(tmp_path: Path) -> None:
    database = Database(f"sqlite+aiosqlite:///{tmp_path}/gateway.db")
    try:
        async with database.statement(writes=True) as scope:
            await driver_rows.rows(scope, "CREATE TABLE notes (body text)", {})
            await driver_rows.rows(scope, "INSERT INTO notes VALUES (:body)", {"body": "one"})
        async with database.statement(writes=False) as scope:
            assert await driver_rows.rows(scope, "SELECT body FROM notes", {}) == [("one",)]
    finally:
        await database.dispose()


async def notes_table(database: Database) -> int:
    """Create the table of notes; the process id of the connection the next block is lent
    (on SQLite, 0)."""
    async with database.session() as db:
        await db.execute(text("CREATE TABLE notes (body text NOT NULL)"))
    return 0 if database.is_sqlite else await backend_pid(database)


async def notes(database: Database) -> list[str]:
    async with database.statement(writes=False) as scope:
        return [body for (body,) in await driver_rows.rows(scope, "SELECT body FROM notes", {})]


async def write_then_fail(database: Database, body: str, *, failure: Exception | None) -> None:
    """A note written, then `failure` raised (None: a NULL note the table refuses)."""
    async with database.driver_transaction() as scope:
        await driver_rows.rows(scope, "INSERT INTO notes VALUES (:body)", {"body": body})
        if failure is not None:
            raise failure
        await driver_rows.rows(scope, "INSERT INTO notes VALUES (NULL)", {})


async def test_a_driver_transaction_commits_together_or_not_at_all_on_a_lent_connection(
    database: Database,
) -> None:
    lent = await notes_table(database)

    async with database.driver_transaction() as scope:
        assert isinstance(scope, driver_rows.LentConnection)
        ((pid,),) = await driver_rows.rows(scope, "SELECT pg_backend_pid()", {})
        async with driver_rows.pipelined(scope):
            await driver_rows.send(scope, "INSERT INTO notes VALUES ('one')", {})
            await driver_rows.send(scope, "INSERT INTO notes VALUES ('two')", {})
        # Not committed until the block ends.
        assert await notes(database) == []
    assert pid == lent
    assert await notes(database) == ["one", "two"]

    with pytest.raises(StorageError, match="null value"):
        await write_then_fail(database, "three", failure=None)
    with pytest.raises(RuntimeError, match="not a database error"):
        await write_then_fail(database, "four", failure=RuntimeError("not a database error"))
    assert await notes(database) == ["one", "two"]

    # The connection went back in autocommit, kept: a statement commits by itself on it.
    async with database.statement(writes=True) as scope:
        ((pid,),) = await driver_rows.rows(scope, "SELECT pg_backend_pid()", {})
        await driver_rows.rows(scope, "INSERT INTO notes VALUES ('five')", {})
    assert pid == lent
    async with database.session() as db:
        assert (await db.execute(text("SELECT count(*) FROM notes"))).scalar() == 3


async def test_on_sqlite_a_driver_transaction_is_a_session(tmp_path: Path) -> None:
    database = Database(f"sqlite+aiosqlite:///{tmp_path}/gateway.db")
    try:
        await notes_table(database)
        with pytest.raises(StorageError):
            await write_then_fail(database, "one", failure=None)
        async with database.driver_transaction() as scope:
            await driver_rows.rows(scope, "INSERT INTO notes VALUES ('two')", {})
        assert await notes(database) == ["two"]
    finally:
        await database.dispose()


async def test_on_sqlite_a_driver_reading_has_a_connection_of_its_own_beside_the_writer(
    tmp_path: Path,
) -> None:
    database = Database(f"sqlite+aiosqlite:///{tmp_path}/gateway.db")
    count = "SELECT count(*) FROM notes"
    try:
        async with database.session() as db:
            await db.execute(text("CREATE TABLE notes (body text NOT NULL)"))
            await db.execute(text("INSERT INTO notes VALUES ('one')"))
        # A writer holds the write lock with a row not committed yet: the reading neither
        # waits for it nor sees the row, and leaves no transaction open.
        async with database.session() as writer:
            await writer.execute(text("INSERT INTO notes VALUES ('two')"))
            async with asyncio.timeout(2), database.driver_reading() as scope:
                assert isinstance(scope, driver_rows.LentSqlite)
                assert await driver_rows.rows(scope, count, {}) == [(1,)]
                assert not scope.raw.in_transaction
                assert database.connections_in_use() == 2  # the writer's and this one
        # A failed reading is a StorageError and leaves nothing held; the next one reads.
        with pytest.raises(StorageError, match="no such table"):
            async with database.driver_reading() as scope:
                await driver_rows.rows(scope, "SELECT * FROM no_such_table", {})
        assert database.connections_in_use() == 0
        async with database.driver_reading() as scope:
            assert await driver_rows.rows(scope, count, {}) == [(2,)]
            async with database.session() as db:
                await db.execute(text("INSERT INTO notes VALUES ('three')"))
            # Each statement reads the last commit: the block holds no snapshot.
            assert await driver_rows.rows(scope, count, {}) == [(3,)]
    finally:
        await database.dispose()
    # A database in memory is one connection's: readings go through its sessions.
    in_memory = Database("sqlite+aiosqlite://")
    try:
        async with in_memory.driver_reading() as scope:
            assert not isinstance(scope, driver_rows.LentSqlite)
            assert await driver_rows.rows(scope, "SELECT 1", {}) == [(1,)]
    finally:
        await in_memory.dispose()


async def atomic_then_fail(database: Database, body: str, *, failure: BaseException) -> None:
    """Two notes sent in an atomic block, then `failure` raised inside it."""
    async with database.driver_atomic() as scope, driver_rows.pipelined(scope):
        await driver_rows.send(scope, "INSERT INTO notes VALUES (:body)", {"body": body})
        await driver_rows.send(scope, "INSERT INTO notes VALUES (:body)", {"body": body + "+"})
        raise failure


async def test_a_driver_atomic_block_commits_at_its_end_with_no_begin_or_commit(
    database: Database,
) -> None:
    lent = await notes_table(database)

    async with database.driver_atomic() as scope:
        assert isinstance(scope, driver_rows.LentConnection)
        assert scope.raw.autocommit  # no BEGIN is sent, so no COMMIT is needed
        async with driver_rows.pipelined(scope) as pipeline:
            pid = await driver_rows.send(scope, "SELECT pg_backend_pid()", {})
            one = await driver_rows.send(
                scope, "INSERT INTO notes VALUES ('one') RETURNING body", {}
            )
            await driver_rows.send(scope, "INSERT INTO notes VALUES ('two')", {})
            await pipeline.commit()  # nothing: the block's end commits
            # Its statements have run in the server, not committed until the block ends.
            assert await notes(database) == []
        # The answers, read once the block has ended.
        assert await pid.rows() == [(lent,)]
        assert await one.rows() == [("one",)]
    assert await notes(database) == ["one", "two"]


async def test_a_driver_atomic_block_fails_whole_and_leaves_its_connection_clean(
    database: Database,
) -> None:
    lent = await notes_table(database)

    # A statement the table refuses: the block's end raises it, nothing commits.
    async def refused() -> None:
        async with database.driver_atomic() as scope, driver_rows.pipelined(scope):
            await driver_rows.send(scope, "INSERT INTO notes VALUES ('one')", {})
            await driver_rows.send(scope, "INSERT INTO notes VALUES (NULL)", {})
            await driver_rows.send(scope, "INSERT INTO notes VALUES ('two')", {})

    with pytest.raises(StorageError, match="null value"):
        await refused()
    # An error of the block's own code, after its statements ran: the Sync would commit them.
    with pytest.raises(RuntimeError, match="not a database error"):
        await atomic_then_fail(database, "three", failure=RuntimeError("not a database error"))

    # Cancelled while waiting inside the block, after its statements ran.
    async def cancelled() -> None:
        await atomic_then_fail(database, "four", failure=asyncio.CancelledError())

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(cancelled())

    # Reading an answer inside the block would send a Sync, committing half of it: refused.
    async def read_inside() -> None:
        async with database.driver_atomic() as scope, driver_rows.pipelined(scope):
            sent = await driver_rows.send(scope, "INSERT INTO notes VALUES ('five')", {})
            await sent.rows()

    with pytest.raises(StorageError, match="after it ends"):
        await read_inside()

    # So is a statement outside the block, which would commit by itself.
    async def outside() -> None:
        async with database.driver_atomic() as scope:
            await driver_rows.rows(scope, "INSERT INTO notes VALUES ('six')", {})

    with pytest.raises(StorageError, match="pipelined block"):
        await outside()
    assert await notes(database) == []

    # The same connection, kept: back in autocommit with no transaction left open.
    async with database.statement(writes=True) as scope:
        ((pid,),) = await driver_rows.rows(scope, "SELECT pg_backend_pid()", {})
        await driver_rows.rows(scope, "INSERT INTO notes VALUES ('seven')", {})
    assert pid == lent
    assert await notes(database) == ["seven"]


async def test_on_sqlite_a_driver_atomic_block_is_a_session(tmp_path: Path) -> None:
    database = Database(f"sqlite+aiosqlite:///{tmp_path}/gateway.db")
    try:
        await notes_table(database)
        with pytest.raises(RuntimeError):
            await atomic_then_fail(database, "one", failure=RuntimeError("not a database error"))
        async with database.driver_atomic() as scope, driver_rows.pipelined(scope):
            assert isinstance(scope, AsyncSession)
            await driver_rows.send(scope, "INSERT INTO notes VALUES ('two')", {})
        assert await notes(database) == ["two"]
    finally:
        await database.dispose()
