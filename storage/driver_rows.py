"""Rows of a text statement read through the database driver itself, as plain tuples.

Recall's search runs a few statements per turn, each returning up to a few hundred rows of
plain columns. Through SQLAlchemy, each statement cost about 0.3 ms of the event loop's CPU
(psycopg alone: 0.13-0.15 ms) and each row a few microseconds more (its result machinery, a
`Row`, the type processing of its timestamp); on SQLite, three hops to the connection's
thread. Reading them through the driver cut a context assembly's event-loop CPU by about 17 %
on PostgreSQL and 28 % on SQLite (`bench/README.md`). So these statements run on the
session's own connection (inside its transaction, after whatever it did before) through
`rows`, which takes SQLAlchemy's `:name` placeholders and aware datetimes as every other
statement does, returns timestamps aware in UTC, and raises `StorageError` for the driver's
errors (the session's rollback then meets the same error, and SQLAlchemy takes a connection
whose server went away out of the pool, as for its own statements). The session's pending
changes to its objects are flushed first, as SQLAlchemy's autoflush does.

The statements every message runs go the same way, for the same reason (through an ORM
session a one-row lookup cost 1.4-1.7 CPU-ms and through the driver 0.85-0.93,
`bench/README.md`): the inbox's INSERT, the dispatcher's read of a user's queue, the user's
current session, the turn's writes (`storage.turn_store`, the session's channel, the reply's
outbox row) and the reply's delivery mark. A JSON column's value is bound as `JsonValue` and
read back decoded (`json_value`).

Only for statements whose columns are plain values (numbers, strings, bytes, timestamps,
JSON); everything else keeps SQLAlchemy.

A statement that is all its caller does (the inbox's INSERT, the dispatcher's read of a
user's queue with their current sessions, a batch of delivery marks, a session's topic) needs
no session at all on PostgreSQL: it runs on a
`LentConnection`, one of the autocommit connections `Database.statement` lends, where a
session cost about 0.65 CPU-ms more than the statement (`storage.autocommit`).

A transaction of such statements whose answers are not needed one by one (the turn's
writes) runs them in a `pipelined` block: `send` queues a statement without waiting for it,
and the next wait (`rows`, `Sent.rows`, the block's end) sends the queue and reads all the
answers at once. Waiting for each of a turn's eight round trips cost its event loop about
0.7-1.3 CPU-ms a message more in two A/B runs (`bench/README.md`). On a `LentConnection`
lent `atomic` the block is the transaction: in autocommit, the statements before its one
`Sync` commit together at its end, with no `BEGIN` or `COMMIT` sent; its answers are read
after it ends.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import aiosqlite
import psycopg
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage.driver_values import (
    JsonValue,
    converted,
    json_value,
    numbered,
    prefixed,
    psycopg_sql,
    psycopg_value,
    sqlite_value,
    utc,
    values_list,
)

__all__ = [
    "BINARY_RESULTS",
    "REQUIREMENT_SQLSTATE",
    "DriverScope",
    "JsonValue",
    "LentConnection",
    "LentSqlite",
    "Pipeline",
    "RequirementError",
    "Sent",
    "dialect_of",
    "driver_error",
    "json_value",
    "numbered",
    "on_sqlite",
    "pipelined",
    "prefixed",
    "required",
    "rows",
    "send",
    "utc",
    "values_list",
]


@dataclass(frozen=True, slots=True)
class LentConnection:
    """A PostgreSQL driver connection lent for a statement or a few: in autocommit, each of
    them committing by itself (`Database.statement`), or in one transaction
    (`Database.driver_transaction`), or, `atomic`, all in one `pipelined` block that commits
    as a whole when it ends (`Database.driver_atomic`). `info` is what a session's `info`
    would hold for the writers of indexed rows (the recall embedder,
    `storage.recall_vectors.embedder_of`)."""

    raw: psycopg.AsyncConnection[Any]
    info: Mapping[str, Any] = field(default_factory=dict)
    atomic: bool = False


@dataclass(frozen=True, slots=True)
class LentSqlite:
    """An aiosqlite connection lent for a read-only transaction of driver statements
    (`Database.driver_reading` on a database file: `storage.sqlite_readers`)."""

    raw: aiosqlite.Connection
    info: Mapping[str, Any] = field(default_factory=dict)


# Where the functions below run their statements: a session's connection, inside its
# transaction, or a lent connection.
DriverScope = AsyncSession | LentConnection | LentSqlite


def dialect_of(scope: DriverScope) -> str:
    """The scope's database: "postgresql" or "sqlite" (a lent connection is PostgreSQL's,
    a lent SQLite connection SQLite's)."""
    if isinstance(scope, LentConnection):
        return "postgresql"
    if isinstance(scope, LentSqlite):
        return "sqlite"
    return str(scope.get_bind().dialect.name)


# PostgreSQL sends the rows in its binary format: a row of the recall search's entry columns
# (integers, strings, a timestamp) loads in about a third of the time of the text format's
# (200 rows: 0.06-0.09 ms against 0.16-0.21), and a vector's `bytea` arrives as its bytes
# rather than as hex. Every column type the statements here return (integers, floats,
# numerics, strings, booleans, timestamps, bytes, JSON, arrays) loads to the same Python
# value either way; a type psycopg knows no loader for would arrive as bytes, not str.
BINARY_RESULTS = True


@dataclass(slots=True)
class _AtomicBlock:
    """An atomic `pipelined` block (a `LentConnection.atomic` scope's): whether it has ended,
    its answers read with the `Sync` that committed it."""

    ended: bool = False


# The pipeline of the block `pipelined` runs, with the driver connection it belongs to and,
# when the block is atomic, its state.
_PIPELINE: ContextVar[tuple[Any, psycopg.AsyncPipeline, _AtomicBlock | None] | None] = ContextVar(
    "driver_rows_pipeline", default=None
)
# The statement an atomic block that fails sends last: its error aborts the implicit
# transaction, so the `Sync` that ends the block rolls everything back.
_ABANDON = "SELECT gateway_require(false, 'the block was abandoned before it ended')"


# Where a session's `info` keeps its transaction's driver connection (see `_driver`).
_DRIVER_KEY = "driver_rows.connection"


async def _driver(session: DriverScope) -> tuple[Any, bool]:
    """The session's driver connection (its pending ORM changes flushed first, as
    SQLAlchemy's autoflush does before its own statements: this one may read them, or be
    overwritten by them), and whether it is SQLite's."""
    if isinstance(session, LentConnection):
        return session.raw, False
    if isinstance(session, LentSqlite):
        return session.raw, True
    pending = session.new or session.dirty or session.deleted
    transaction = session.sync_session.get_transaction()
    known = session.info.get(_DRIVER_KEY)
    if not pending and known is not None and transaction is not None and known[0] is transaction:
        # The transaction holds its connection until it ends: asking the session again (two
        # hops into SQLAlchemy's greenlet) cost 0.05 ms a statement.
        return known[1], known[2]
    try:
        if pending:
            await session.flush()
        connection = await session.connection()
        raw = (await connection.get_raw_connection()).driver_connection
    except SQLAlchemyError as exc:
        raise StorageError(f"database error: {exc.__class__.__name__}") from exc
    if raw is None:
        raise StorageError("database error: the connection is closed")
    sqlite = connection.dialect.name == "sqlite"
    session.info[_DRIVER_KEY] = (session.sync_session.get_transaction(), raw, sqlite)
    return raw, sqlite


REQUIREMENT_SQLSTATE = "GW409"
"""What `gateway_require(ok, reason)` raises when `ok` is not true (PostgreSQL, migration
0009): a statement's condition that must abort the transaction, as `RequirementError`."""


def required(reason: str) -> str:
    """The SQL condition of a one-row aggregate that raises `reason` unless exactly one row
    was aggregated: `SELECT max(id) FROM changed HAVING {required('…')}` returns that row's
    value, or aborts the transaction (an aggregate's HAVING is evaluated once, rows or not).
    `reason` is our own constant: written into the SQL as a literal."""
    return "gateway_require(count(*) = 1, '" + reason.replace("'", "''") + "')"


class RequirementError(StorageError):
    """A statement's requirement (`required`) was not met; `reason` is the one it gave. The
    transaction is aborted."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def driver_error(exc: psycopg.Error | sqlite3.Error) -> StorageError:
    """The driver's error as the error tree's (`RequirementError` for a requirement's)."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate == REQUIREMENT_SQLSTATE:
        return RequirementError(exc.diag.message_primary or "a requirement was not met")
    lines = str(exc).strip().splitlines()
    return StorageError(f"database error: {lines[0] if lines else type(exc).__name__}")


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A `pipelined` block's pipeline (None on SQLite, where the block changes nothing)."""

    _pipeline: psycopg.AsyncPipeline | None
    _connection: psycopg.AsyncConnection[Any] | None = None
    _atomic: _AtomicBlock | None = None

    async def commit(self) -> None:
        """Commit the transaction with what is queued, in one round trip (PostgreSQL): the
        block's statements must check what has to hold themselves (`required`), since no
        answer is looked at before the `COMMIT`; an error of any of them aborts the
        transaction and raises here. The session's own commit then has nothing left to do
        (psycopg sends nothing for an idle connection). In an atomic block nothing: the
        block's end commits it (and raises what a statement refused). On SQLite nothing:
        the session commits when it ends, after its caller has checked the answers."""
        if self._pipeline is None or self._connection is None or self._atomic is not None:
            return
        try:
            await self._connection.commit()
        except psycopg.Error as exc:
            raise driver_error(exc) from exc

    async def sync(self) -> None:
        """Send what is queued and wait for all of it (the next wait would). Not in an atomic
        block, whose end is its one wait: a `Sync` inside it would commit half of it."""
        if self._pipeline is None:
            return
        if self._atomic is not None:
            raise StorageError("an atomic block is synced only by its end")
        try:
            await self._pipeline.sync()
        except psycopg.Error as exc:
            raise driver_error(exc) from exc

    async def recover(self) -> None:
        """After a statement's error: take the answers of the statements queued behind it
        (aborted, each raising again at the next wait), so the block goes on, or ends,
        with nothing outstanding. One sync takes them all, a second finds none. In an atomic
        block nothing: its end rolls it back and takes them."""
        if self._pipeline is None or self._atomic is not None:
            return
        with suppress(psycopg.Error):
            await self._pipeline.sync()
            return
        await self.sync()


@asynccontextmanager
async def pipelined(session: DriverScope) -> AsyncIterator[Pipeline]:
    """A block whose statements through `send` and `rows` reach PostgreSQL without waiting
    for each other's answers (psycopg's pipeline mode): `send` queues its statement, and
    `rows` (or `Sent.rows`) sends what is queued and waits once for all of it. A turn's
    writes thus cost two or three round trips instead of one each. On SQLite (a call into
    the connection's thread, no network) the block changes nothing.

    Only driver statements inside: the ORM reads its results one statement at a time.
    An error of a queued statement surfaces at the next wait (as `StorageError`), and the
    statements after it in the transaction do not run."""
    raw, sqlite = await _driver(session)
    if sqlite:
        yield Pipeline(None)
        return
    atomic = _AtomicBlock() if isinstance(session, LentConnection) and session.atomic else None
    try:
        async with raw.pipeline() as pipeline:
            token = _PIPELINE.set((raw, pipeline, atomic))
            try:
                yield Pipeline(pipeline, raw, atomic)
            except BaseException:
                if atomic is not None:
                    await _abandon(raw, pipeline)
                raise
            finally:
                _PIPELINE.reset(token)
    except psycopg.Error as exc:
        raise driver_error(exc) from exc
    finally:
        if atomic is not None:
            atomic.ended = True


async def _abandon(raw: psycopg.AsyncConnection[Any], pipeline: psycopg.AsyncPipeline) -> None:
    """Roll an atomic block back: the statements it sent wait in the server's implicit
    transaction, which a `Sync` would commit. A statement that fails is sent first, so the
    `Sync` rolls them all back (a pipeline that a statement already aborted refuses it:
    nothing commits then either), and the answers are taken here, so the block ends clean.
    If that is interrupted (cancelled again), the connection is closed before any `Sync`
    can follow: the server rolls back what it never saw committed."""
    try:
        with suppress(psycopg.Error):
            await raw.execute(_ABANDON, prepare=False)
        for _ in range(2):  # the first raises the block's error and stops; the second ends it
            with suppress(psycopg.Error):
                await pipeline.sync()
    except BaseException:
        raw.pgconn.finish()
        raise


async def on_sqlite(session: DriverScope) -> bool:
    """Whether the scope's database is SQLite (its connection, once known, is remembered for
    the transaction: no cost)."""
    return (await _driver(session))[1]


async def _connection(
    session: DriverScope,
) -> tuple[Any, bool, tuple[Any, psycopg.AsyncPipeline, _AtomicBlock | None] | None]:
    """The scope's driver connection, whether it is SQLite's, and the `pipelined` block it
    is in (None outside one)."""
    raw, sqlite = await _driver(session)
    active = _PIPELINE.get()
    if active is None or sqlite or active[0] is not raw:
        if isinstance(session, LentConnection) and session.atomic:
            # On its own the statement would commit by itself.
            raise StorageError("an atomic scope's statements run in its pipelined block")
        return raw, sqlite, None
    return raw, sqlite, active


@dataclass(slots=True)
class Sent:
    """A statement `send` ran; its rows (if it returns any) through `rows`."""

    _cursor: psycopg.AsyncCursor[Any] | None
    _pipeline: psycopg.AsyncPipeline | None
    _found: list[tuple[Any, ...]]
    _timestamps: Sequence[int]
    _atomic: _AtomicBlock | None = None

    async def rows(self) -> list[tuple[Any, ...]]:
        """Its rows, the columns at the positions `timestamps` aware in UTC (in a pipeline,
        after sending what is queued and waiting for it, unless that was done already; in an
        atomic block, once the block has ended: a wait inside it would commit half of it).
        Read once: a second call gives the same rows."""
        if self._cursor is None:
            return self._found
        try:
            if self._cursor.pgresult is None and self._pipeline is not None:
                if self._atomic is not None and not self._atomic.ended:
                    raise StorageError("an atomic block's answers are read after it ends")
                await self._pipeline.sync()
            found = await self._cursor.fetchall() if self._cursor.description is not None else []
        except psycopg.Error as exc:
            raise driver_error(exc) from exc
        self._cursor, self._found = None, converted(found, self._timestamps)
        return self._found


async def send(
    session: DriverScope, sql: str, params: Mapping[str, Any], *, timestamps: Sequence[int] = ()
) -> Sent:
    """Run `sql` on the session's connection as `rows` does; in a `pipelined` block, without
    waiting for its answer."""
    raw, sqlite, block = await _connection(session)
    if block is None:
        return Sent(None, None, await _execute(raw, sqlite, sql, params, timestamps), timestamps)
    _, pipeline, atomic = block
    cursor = raw.cursor(binary=BINARY_RESULTS)
    try:
        await cursor.execute(psycopg_sql(sql), {k: psycopg_value(v) for k, v in params.items()})
    except psycopg.Error as exc:
        raise driver_error(exc) from exc
    return Sent(cursor, pipeline, [], timestamps, atomic)


async def rows(
    session: DriverScope, sql: str, params: Mapping[str, Any], *, timestamps: Sequence[int] = ()
) -> list[tuple[Any, ...]]:
    """Run `sql` on the session's connection; its rows as tuples, the columns at the
    positions `timestamps` aware in UTC."""
    raw, sqlite, block = await _connection(session)
    if block is not None:
        return await (await send(session, sql, params, timestamps=timestamps)).rows()
    return await _execute(raw, sqlite, sql, params, timestamps)


async def _execute(
    raw: Any, sqlite: bool, sql: str, params: Mapping[str, Any], timestamps: Sequence[int]
) -> list[tuple[Any, ...]]:
    try:
        if sqlite:
            # One hop to the connection's thread, not three (execute, fetch, close).
            found = await raw.execute_fetchall(sql, {k: sqlite_value(v) for k, v in params.items()})
        else:
            async with raw.cursor(binary=BINARY_RESULTS) as cursor:
                await cursor.execute(
                    psycopg_sql(sql), {k: psycopg_value(v) for k, v in params.items()}
                )
                found = await cursor.fetchall() if cursor.description is not None else []
    except (psycopg.Error, sqlite3.Error) as exc:
        raise driver_error(exc) from exc
    return converted(found, timestamps)
