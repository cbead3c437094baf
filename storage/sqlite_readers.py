"""SQLite connections that this process keeps for read-only transactions of driver statements.

A recall search reads in two transactions of its own, side by side (`Database.driver_reading`).
Through a SQLAlchemy session each one cost the event loop about 0.6 ms of CPU with a single
statement, against 0.1 ms on an aiosqlite connection of its own (`BEGIN DEFERRED`, the
statement, `COMMIT`; a scratch loop on the database of `bench/context.py`): the session's
state machine, the pool's checkout and the greenlet hops, not the statement. `SqliteReaders`
keeps a few such connections to the database file and lends one for the length of a block,
as `storage.autocommit` does on PostgreSQL.

Under WAL a deferred transaction that only reads takes no lock and sees one snapshot of the
database (from its first read), beside the one writer; it never writes here. A connection
comes back to the idle list only when its transaction ended cleanly; one that failed is
closed (the next block opens another). A database in memory has nothing to share between
connections: `Database` uses its sessions there.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import aiosqlite

from storage import driver_rows
from storage.driver_rows import LentSqlite

BUSY_TIMEOUT_MS = 5000
"""How long a SQLite connection waits for a lock before failing: these and the engine's
(`storage.database._sqlite_pragmas`)."""


class SqliteReaders:
    """At most `size` aiosqlite connections to the database file `path`, each lent to one
    block at a time for one read-only transaction."""

    def __init__(self, path: str, *, size: int, info: dict[str, Any]) -> None:
        """Connections are opened on demand; `info` is what a session's `info` holds."""
        self._path = path
        self._info = info
        self._slots = asyncio.Semaphore(size)
        self._idle: list[aiosqlite.Connection] = []
        self._lent = 0
        self._closed = False

    @property
    def in_use(self) -> int:
        """How many connections are lent now."""
        return self._lent

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[LentSqlite]:
        """A connection in a deferred transaction for the block (waiting while all of them
        are lent), ended when the block ends; a database error is a `StorageError`."""
        async with self._slots:
            raw = self._idle.pop() if self._idle else await self._connect()
            self._lent += 1
            clean = False
            try:
                await raw.execute("BEGIN DEFERRED")
                yield LentSqlite(raw, self._info)
                await raw.execute("COMMIT")
                clean = True
            except sqlite3.Error as exc:
                raise driver_rows.driver_error(exc) from exc
            finally:
                self._lent -= 1
                await self._give_back(raw, clean=clean)

    async def _connect(self) -> aiosqlite.Connection:
        try:
            raw = await aiosqlite.connect(self._path, isolation_level=None)
            await raw.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        except sqlite3.Error as exc:
            raise driver_rows.driver_error(exc) from exc
        return raw

    async def _give_back(self, raw: aiosqlite.Connection, *, clean: bool) -> None:
        if clean and not self._closed and not raw.in_transaction:
            self._idle.append(raw)
            return
        # The block failed (or was cancelled) inside its transaction: end it, and keep no
        # connection whose state is unknown.
        with suppress(sqlite3.Error, ValueError):
            if raw.in_transaction:
                await raw.execute("ROLLBACK")
        with suppress(sqlite3.Error, ValueError):
            await raw.close()

    async def close(self) -> None:
        """Close the idle connections (and those lent, as they come back)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for raw in idle:
            with suppress(sqlite3.Error, ValueError):
                await raw.close()
