"""Turn locks: one holder at a time per key (a user's queue), also across processes.

On PostgreSQL the lock is a session-level advisory lock held on a connection of its own for as
long as the holder works; if the process dies the connection drops and the lock with it. On
SQLite (one process by design) an in-process lock is enough.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from storage.database import Database


class TurnLocks(Protocol):
    """Try-locks by key: `hold(key)` yields True when this caller now holds the key."""

    def hold(self, key: str) -> AbstractAsyncContextManager[bool]:
        """Try to take the lock for the duration of the block; never waits for a holder."""
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


def advisory_key(key: str) -> int:
    """A stable signed 64-bit number for `key` (PostgreSQL advisory locks take a bigint)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)


class PostgresTurnLocks:
    """Advisory try-locks shared by every gateway process on one PostgreSQL database."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._local = LocalTurnLocks()

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
            async with self.database.engine.connect() as connection:
                acquired = bool(await connection.scalar(select(func.pg_try_advisory_lock(number))))
                await connection.commit()
                try:
                    yield acquired
                finally:
                    if acquired:
                        await asyncio.shield(self._unlock(connection, number))

    @staticmethod
    async def _unlock(connection: AsyncConnection, number: int) -> None:
        await connection.scalar(select(func.pg_advisory_unlock(number)))
        await connection.commit()


def turn_locks_for(database: Database) -> TurnLocks:
    """The lock kind the database supports."""
    return LocalTurnLocks() if database.is_sqlite else PostgresTurnLocks(database)
