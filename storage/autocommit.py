"""PostgreSQL connections in autocommit that this process keeps for one statement at a time.

The statements the gateway runs most that are all their caller does (the inbox's multi-row
INSERT, the dispatcher's read of a user's queue, a batch of delivery marks) need no session:
through `Database.single` each one cost about 0.85 CPU-ms, of which 0.2 was the statement and
the rest the session and the pool's checkout and return (SQLAlchemy's state machine, events
and greenlet hops). `AutocommitConnections` keeps a few connections out of the engine's pool
for good and lends their driver connection (`storage.driver_rows.LentConnection`) for the
length of a block: about 0.2 CPU-ms a statement. A block of driver statements that must
commit together borrows one with a transaction (`lend_transaction`: a pipeline of six
statements and its commit cost 0.47-0.49 CPU-ms that way against 0.82-0.94 in a session),
or, when they all go in one pipeline (a turn's write), stays in autocommit: the statements
before the pipeline's `Sync` are one implicit transaction (`Database.driver_atomic`).

A connection comes back to the idle list only if it is usable: not broken, not closed, no
transaction left open, in autocommit. A broken one (a database restart, a terminated
backend) is dropped with every idle one, which were opened before the same failure, as
SQLAlchemy's pool does with its own connections: the statement that met it fails once, and
the next one connects again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from errors import StorageError
from storage import driver_rows
from storage.driver_rows import LentConnection


@dataclass(frozen=True, slots=True)
class _Held:
    connection: AsyncConnection
    raw: psycopg.AsyncConnection[Any]


class AutocommitConnections:
    """At most `size` connections of `engine`'s pool in autocommit, lent one block at a time."""

    def __init__(self, engine: AsyncEngine, *, size: int) -> None:
        """Connections are opened on demand, the first time more are lent at once."""
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._slots = asyncio.Semaphore(size)
        self._idle: list[_Held] = []
        self._closed = False

    @asynccontextmanager
    async def lend(self) -> AsyncIterator[LentConnection]:
        """A connection for the block (waiting while all of them are lent)."""
        async with self._slots:
            held = self._idle.pop() if self._idle else await self._connect()
            try:
                yield LentConnection(held.raw)
            finally:
                await self._give_back(held)

    @asynccontextmanager
    async def lend_transaction(self) -> AsyncIterator[LentConnection]:
        """A connection with a transaction for the block: psycopg begins it with the first
        statement (in a pipeline, sent with it), the block's end commits what is left to
        commit (nothing after `driver_rows.Pipeline.commit`), an error rolls it back. The
        connection goes back in autocommit; one that cannot is not kept."""
        async with self.lend() as lent:
            raw = lent.raw
            try:
                await raw.set_autocommit(False)
                yield lent
                await raw.commit()
            except BaseException as exc:
                with suppress(psycopg.Error):
                    await raw.rollback()
                if isinstance(exc, psycopg.Error):
                    raise driver_rows.driver_error(exc) from exc
                raise
            finally:
                with suppress(psycopg.Error):
                    await raw.set_autocommit(True)

    @property
    def idle(self) -> int:
        """How many of its connections are kept, not lent now."""
        return len(self._idle)

    async def close(self) -> None:
        """Return the idle connections to the pool; those lent now follow when given back."""
        self._closed = True
        idle, self._idle = self._idle, []
        for held in idle:
            await _release(held, invalidate=False)

    async def _connect(self) -> _Held:
        try:
            connection = await self._engine.connect()
            raw = (await connection.get_raw_connection()).driver_connection
        except SQLAlchemyError as exc:
            raise StorageError(f"database error: {exc.__class__.__name__}: {exc}") from exc
        if raw is None:  # the pool's connection was closed under it
            await connection.invalidate()
            raise StorageError("database error: the connection is closed")
        return _Held(connection, raw)

    async def _give_back(self, held: _Held) -> None:
        raw = held.raw
        broken = raw.broken or raw.closed
        if (
            not broken
            and not self._closed
            and raw.info.transaction_status == TransactionStatus.IDLE
            and raw.autocommit
        ):
            self._idle.append(held)
            return
        dropped = [held]
        if broken:
            # The server went away under it: so it did under the idle ones, opened before.
            dropped, self._idle = [held, *self._idle], []
        for each in dropped:
            # Back to the pool only when the lender closes and the connection is sound.
            await _release(each, invalidate=broken or not self._closed)


async def _release(held: _Held, *, invalidate: bool) -> None:
    """Return a connection to the pool, or close it for good first (`invalidate`)."""
    with suppress(SQLAlchemyError, OSError):
        if invalidate:
            await held.connection.invalidate()
        await held.connection.close()
