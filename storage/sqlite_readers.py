"""SQLite connections that this process keeps for read-only driver statements.

A recall search reads in two halves of its own, side by side (`Database.driver_reading`).
Through a SQLAlchemy session each one cost the event loop about 0.6 ms of CPU with a single
statement, against 0.1 ms on an aiosqlite connection of its own (a scratch loop on the
database of `bench/context.py`): the session's state machine, the pool's checkout and the
greenlet hops, not the statement. `SqliteReaders` keeps a few such connections to the
database file and lends one for the length of a block, as `storage.autocommit` does on
PostgreSQL.

The statements run in autocommit: each one reads the snapshot of the last commit when it
starts (under WAL it takes no lock, beside the one writer) and holds nothing after it. No
`BEGIN DEFERRED` and `COMMIT` go around them, each a hop to the connection's thread: on the
long history of `bench/context.py`, in three of four A/B pairs an assembly took 0.1-1.4 ms
less at the p50, 0.4-1.3 at the p95 and 0.24-0.72 CPU-ms less of the event loop (the fourth
pair went the other way by 0.6 ms and 0.07 CPU-ms: the noise of the machine). A block's
statements may therefore see different commits; a recall search needs no one snapshot
(later entries have higher ids than the window it counted, and entries deleted meanwhile
drop out where it reads them). A connection comes back to the idle list only when its block
ended cleanly; one that failed is closed (the next block opens another). A database in
memory has nothing to share between connections: `Database` uses its sessions there.
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
    block at a time for read-only statements in autocommit."""

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
        """A connection in autocommit for the block's reads (waiting while all of them are
        lent); a database error is a `StorageError`."""
        async with self._slots:
            raw = self._idle.pop() if self._idle else await self._connect()
            self._lent += 1
            clean = False
            try:
                yield LentSqlite(raw, self._info)
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
        # The block failed (or was cancelled): keep no connection whose state is unknown
        # (a statement of its own may have left a transaction open).
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
