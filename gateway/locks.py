"""Turn locks: one holder at a time per key (a user's queue), also across processes.

On PostgreSQL the lock is a session-level advisory lock, held on the process's lock connection
for as long as the holder works; if the process dies the connection drops and the lock with it.
On SQLite (one process by design) an in-process lock is enough.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.log import get_logger
from storage.database import Database

log = get_logger(__name__)


class TurnLocks(Protocol):
    """Try-locks by key: `hold(key)` yields True when this caller now holds the key."""

    def hold(self, key: str) -> AbstractAsyncContextManager[bool]:
        """Try to take the lock for the duration of the block; never waits for a holder."""
        ...

    async def close(self) -> None:
        """Release what the locks keep open (at shutdown, after the last holder)."""
        ...


class LocalTurnLocks:
    """In-process try-locks (SQLite deployments run one process)."""

    def __init__(self) -> None:
        self._held: set[str] = set()

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[bool]:
        """Take `key` unless someone in this process holds it."""
        if key in self._held:
            yield False
            return
        self._held.add(key)
        try:
            yield True
        finally:
            self._held.discard(key)

    async def close(self) -> None:
        """Nothing to release: the locks live in this process."""


def advisory_key(key: str) -> int:
    """A stable signed 64-bit number for `key` (PostgreSQL advisory locks take a bigint)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)


class PostgresTurnLocks:
    """Advisory try-locks shared by every gateway process on one PostgreSQL database.

    A process holds all its locks on one connection of its own (in autocommit), so a turn
    waiting for the model keeps no pooled connection busy and taking or releasing a lock is a
    single round trip. If that connection is lost the server releases its locks; the next
    lock operation reconnects and takes back the keys still held here, logging any that
    another process took in between.
    """

    def __init__(self, database: Database) -> None:
        self.database = database
        self._local = LocalTurnLocks()
        self._connection: AsyncConnection | None = None
        self._in_use = asyncio.Lock()
        self._held: dict[str, int] = {}  # keys locked at the server: key → advisory number

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[bool]:
        """Take `key` unless another process (or task) holds it."""
        # The in-process check first: advisory locks are re-entrant per connection, and a
        # second task of this process must see the key as taken without a round trip.
        async with self._local.hold(key) as held_here:
            if not held_here:
                yield False
                return
            number = advisory_key(key)
            acquired = await self._call(func.pg_try_advisory_lock, number)
            if acquired:
                self._held[key] = number
            try:
                yield acquired
            finally:
                if acquired:
                    await asyncio.shield(self._release(key, number))

    async def close(self) -> None:
        """Close the lock connection (the server releases whatever it still held)."""
        async with self._in_use:
            await self._disconnect()

    async def _release(self, key: str, number: int) -> None:
        # False from the server means the lock went with a lost connection: already logged.
        self._held.pop(key, None)
        await self._call(func.pg_advisory_unlock, number)

    async def _call(self, function: Callable[[int], Any], number: int) -> bool:
        async with self._in_use:
            try:
                return await self._call_once(function, number)
            except DBAPIError as exc:
                if not exc.connection_invalidated:
                    raise
            # The connection was lost (a database restart, a terminated backend): once more
            # on a new one, which takes back the locks still held here first.
            return await self._call_once(function, number)

    async def _call_once(self, function: Callable[[int], Any], number: int) -> bool:
        connection = await self._connected()
        try:
            return bool(await connection.scalar(select(function(number))))
        except BaseException:
            # Failed or cancelled mid-call: the connection's state is unknown (and with it the
            # server's locks); the next call starts on a new one.
            await self._disconnect()
            raise

    async def _connected(self) -> AsyncConnection:
        if self._connection is not None and not self._connection.invalidated:
            return self._connection
        await self._disconnect()
        connection = await self.database.engine.connect()
        try:
            connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
            lost = [
                key
                for key, number in list(self._held.items())
                if not await connection.scalar(select(func.pg_try_advisory_lock(number)))
            ]
        except BaseException:
            await connection.close()
            raise
        self._connection = connection
        if self._held:
            log.warning("turn_lock.reconnected", held=len(self._held), lost=len(lost))
        for key in lost:
            # Another process took the key while this one had no connection: the turns of
            # that user may have overlapped once. Nothing to undo here; said loudly.
            log.error("turn_lock.lost", key=key)
        return connection

    async def _disconnect(self) -> None:
        # Invalidated, not returned to the pool: closing the database connection is what
        # releases whatever advisory locks it still holds.
        connection, self._connection = self._connection, None
        if connection is not None:
            with suppress(SQLAlchemyError, OSError):
                await connection.invalidate()
                await connection.close()


def turn_locks_for(database: Database) -> TurnLocks:
    """The lock kind the database supports."""
    return LocalTurnLocks() if database.is_sqlite else PostgresTurnLocks(database)
