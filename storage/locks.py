"""Turn locks: one holder at a time per key (a user's queue), also across processes.

On PostgreSQL the lock is a session-level advisory lock, held on the process's lock connection
for as long as the holder works; if the process dies the connection drops and the lock with it.
On SQLite (one process by design) an in-process lock is enough.

A holder may ask for a first read with the lock (`hold_reading`): on PostgreSQL its
statements go on the lock connection right behind the take, in the same round trip, so a
drain's first look at the user's queue costs no connection and no transaction of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import psycopg
import structlog
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from errors import StorageError
from storage import driver_rows
from storage.database import Database
from storage.driver_rows import LentConnection
from storage.group_commit import GroupCommit

log = structlog.stdlib.get_logger(__name__)

T = TypeVar("T")

# A holder's first read under its lock: sends its statements on the given connection
# without waiting for them (`storage.driver_rows.send` in a pipelined block) and returns
# what reads their answers, which are in by the time the holder gets it.
FirstRead = Callable[[LentConnection], Awaitable[T]]


@dataclass(frozen=True, slots=True)
class Held(Generic[T]):
    """A try-lock's outcome: whether the caller now holds the key (the value's truth), and
    what its first read sent, if the lock ran it (None: not taken, not asked for, failed,
    or a lock kind that leaves it to the holder; the holder then reads by itself)."""

    taken: bool
    first: T | None = None

    def __bool__(self) -> bool:
        return self.taken


class TurnLocks(Protocol):
    """Try-locks by key: `hold(key)` yields True when this caller now holds the key."""

    def hold(self, key: str) -> AbstractAsyncContextManager[bool]:
        """Try to take the lock for the duration of the block; never waits for a holder."""
        ...

    def hold_reading(self, key: str, first: FirstRead[T]) -> AbstractAsyncContextManager[Held[T]]:
        """`hold`, and the holder's first read: run with the take when the lock kind can do
        that for less (`Held.first`), else left to the holder."""
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

    @asynccontextmanager
    async def hold_reading(self, key: str, first: FirstRead[T]) -> AsyncIterator[Held[T]]:
        """`hold`; the first read is the holder's (it would cost the same here)."""
        async with self.hold(key) as held:
            yield Held(held)

    async def close(self) -> None:
        """Nothing to release: the locks live in this process."""


def advisory_key(key: str) -> int:
    """A stable signed 64-bit number for `key` (PostgreSQL advisory locks take a bigint)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)


@dataclass(frozen=True, slots=True)
class LockCall:
    """One call on the lock connection: take (try-lock) or release an advisory number; a
    take may bring its holder's first read."""

    number: int
    take: bool
    first: FirstRead[Any] | None = None


@dataclass(frozen=True, slots=True)
class LockAnswer:
    """A call's answer: whether the number was taken (or released), and what its first
    read sent (None when it was not run, or failed)."""

    done: bool
    first: Any = None


# One statement for every call that queued up: each row takes or releases one number. A key
# appears twice only when a release is still queued as the key's next holder takes it; the
# server counts advisory locks per connection, so either order leaves it taken once.
# Sent through the driver itself (as `storage.driver_rows` explains: SQLAlchemy's execute
# cost more CPU than the statement), prepared on the lock connection.
LOCK_CALLS = (
    "SELECT CASE WHEN c.take THEN pg_try_advisory_lock(c.number)"
    " ELSE pg_advisory_unlock(c.number) END"
    " FROM unnest(CAST(%(numbers)s AS bigint[]), CAST(%(takes)s AS boolean[]))"
    " WITH ORDINALITY AS c(number, take, position)"
    " ORDER BY c.position"
)
MAX_CALLS = 1000  # calls per statement at most


class PostgresTurnLocks:
    """Advisory try-locks shared by every gateway process on one PostgreSQL database.

    A process holds all its locks on one connection of its own (in autocommit), so a turn
    waiting for the model keeps no pooled connection busy. The calls that queue up while one
    statement runs go together in the next (`storage.group_commit`), so however many turns
    start or end at once, taking and releasing their locks costs a round trip (and a commit)
    per batch, not per call. If that connection is lost the server releases its locks; the
    next lock operation reconnects and takes back the keys still held here, logging any that
    another process took in between.
    """

    def __init__(self, database: Database) -> None:
        self.database = database
        self._local = LocalTurnLocks()
        self._connection: AsyncConnection | None = None
        self._in_use = asyncio.Lock()
        self._held: dict[str, int] = {}  # keys locked at the server: key → advisory number
        self._calls: GroupCommit[LockCall, LockAnswer] = GroupCommit(
            self._run, max_batch=MAX_CALLS, abandoned=self._release_abandoned
        )

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[bool]:
        """Take `key` unless another process (or task) holds it."""
        async with self._hold(key, None) as held:
            yield held.taken

    @asynccontextmanager
    async def hold_reading(self, key: str, first: FirstRead[T]) -> AsyncIterator[Held[T]]:
        """`hold`, with `first` sent right behind the take, in its round trip."""
        async with self._hold(key, first) as held:
            yield held

    @asynccontextmanager
    async def _hold(self, key: str, first: FirstRead[Any] | None) -> AsyncIterator[Held[Any]]:
        # The in-process check first: advisory locks are re-entrant per connection, and a
        # second task of this process must see the key as taken without a round trip.
        async with self._local.hold(key) as held_here:
            if not held_here:
                yield Held(False)
                return
            number = advisory_key(key)
            answer = await self._calls.submit(LockCall(number, take=True, first=first))
            acquired = answer.done
            if acquired:
                self._held[key] = number
            try:
                yield Held(acquired, answer.first)
            finally:
                if acquired:
                    # Queued at once (a holder cancelled here must not leave the key locked);
                    # False from the server means the lock went with a lost connection,
                    # which was logged then.
                    self._held.pop(key, None)
                    await asyncio.shield(self._calls.enqueue(LockCall(number, take=False)))

    async def close(self) -> None:
        """Close the lock connection (the server releases whatever it still held)."""
        await self._calls.drained()
        async with self._in_use:
            await self._disconnect()

    def _release_abandoned(self, call: LockCall, answer: LockAnswer) -> None:
        # The caller was cancelled while its lock was being taken: nobody holds it, so it is
        # released (each successful take needs its own release: the locks are re-entrant).
        if call.take and answer.done:
            self._calls.enqueue(LockCall(call.number, take=False))

    async def _run(self, calls: list[LockCall]) -> list[LockAnswer]:
        async with self._in_use:
            try:
                try:
                    return await self._run_once(calls)
                except (psycopg.OperationalError, StorageError) as exc:
                    if not _connection_lost(exc):
                        raise
                # The connection may be lost (a database restart, a terminated backend): once
                # more on a new one, which takes back the locks still held here first.
                return await self._run_once(calls)
            except (SQLAlchemyError, psycopg.Error) as exc:
                message = str(getattr(exc, "orig", None) or exc).strip().splitlines()
                raise StorageError(
                    f"turn lock call failed: {message[0] if message else type(exc).__name__}"
                ) from exc

    async def _run_once(self, calls: list[LockCall]) -> list[LockAnswer]:
        connection = await self._connected()
        try:
            return await _execute(connection, calls)
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
            held = list(self._held.items())
            taken = await _execute(connection, [LockCall(number, take=True) for _, number in held])
        except BaseException:
            await connection.close()
            raise
        self._connection = connection
        lost = [key for (key, _), retaken in zip(held, taken, strict=True) if not retaken.done]
        if held:
            log.warning("turn_lock.reconnected", held=len(held), lost=len(lost))
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


def _connection_lost(exc: BaseException) -> bool:
    """Whether the lock connection failed rather than a statement on it: the driver's
    operational error, itself or (through a `driver_rows` pipeline, a call with first
    reads) as the cause of a `StorageError`."""
    return isinstance(exc, psycopg.OperationalError) or isinstance(
        exc.__cause__, psycopg.OperationalError
    )


async def _execute(connection: AsyncConnection, calls: list[LockCall]) -> list[LockAnswer]:
    """Run the calls in one statement, and the first reads of the takes among them right
    behind it in the same round trip; one answer per call, in order."""
    if not calls:
        return []
    raw = (await connection.get_raw_connection()).driver_connection
    if raw is None:
        raise StorageError("turn lock call failed: the lock connection is closed")
    params = {"numbers": [call.number for call in calls], "takes": [call.take for call in calls]}
    reads = [(position, call.first) for position, call in enumerate(calls) if call.first]
    if not reads:
        alone = await raw.execute(LOCK_CALLS, params, prepare=True)
        return [LockAnswer(bool(done)) for (done,) in await alone.fetchall()]
    # Reads are sent for every take, before knowing which were taken: one whose take failed
    # is dropped (reading cost the server a statement; waiting for the takes, a round trip).
    # Session-level advisory locks ignore transactions: a read that fails aborts the rest of
    # the round trip's implicit transaction, never the locks taken or released in it.
    scope = LentConnection(raw)
    sent: dict[int, Any] = {}
    failed: StorageError | None = None
    cursor: psycopg.AsyncCursor[Any] | None = None
    try:
        async with driver_rows.pipelined(scope) as pipeline:
            cursor = await raw.execute(LOCK_CALLS, params, prepare=True)
            try:
                for position, first in reads:
                    sent[position] = await first(scope)
            except StorageError as exc:
                # A statement's error surfaces at the first send after its answer came in
                # (or at the block's end, which waits for all of them: the one round trip);
                # the statements queued behind it were not run.
                await pipeline.recover()
                failed = exc
    except StorageError as exc:
        failed = exc
    if failed is not None:
        if cursor is None or cursor.pgresult is None:
            raise failed  # the lock statement's own failure
        # A read failed: its holder, and the holders of the other reads sent with it, read
        # by themselves.
        log.warning("turn_lock.first_read_failed", error=str(failed))
        sent.clear()
    assert cursor is not None  # sent first, or the block raised above
    done = [bool(value) for (value,) in await cursor.fetchall()]
    return [
        LockAnswer(taken, sent.get(position) if taken else None)
        for position, taken in enumerate(done)
    ]


def turn_locks_for(database: Database) -> TurnLocks:
    """The lock kind the database supports."""
    return LocalTurnLocks() if database.is_sqlite else PostgresTurnLocks(database)
