"""Group commit: calls that arrive while one batch runs are run together as the next batch.

The inbox, the outbox's delivery marks and the turn locks each pay one database commit per
batch instead of one per call; the local transcript store's segments, one worker-thread
hand-off. Nothing waits on purpose: an idle batcher runs a call at once (after the callers of
the same event-loop turn have joined it), so a lone call costs what it did before, and under
load the batch grows by itself to what arrived during the last call.

Every caller returns only after its batch finished, with its own result or the batch's error.
A caller that is cancelled before its batch starts is left out of it; one cancelled later does
not stop the batch (the others depend on it), and `abandoned` is told the result nobody took.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import psycopg
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError

from errors import StorageError

T = TypeVar("T")
R = TypeVar("R")


def refused_for_its_content(exc: BaseException) -> bool:
    """Whether the database refused a statement because of the values in it (too long, not
    encodable, not serialisable) rather than because it could not be reached: a batch that
    fails like this is retried call by call, so one bad call fails alone."""
    cause = exc.__cause__ if isinstance(exc, StorageError) else exc
    # Through SQLAlchemy, or through the driver itself (`storage.driver_rows`).
    if isinstance(
        cause,
        DataError
        | IntegrityError
        | psycopg.DataError
        | psycopg.IntegrityError
        | sqlite3.DataError
        | sqlite3.IntegrityError,
    ):
        return True
    # A value the driver could not bind (a JSON serialiser or type check failed) never
    # reached the server.
    return isinstance(cause, StatementError) and not isinstance(cause, DBAPIError)


@dataclass(slots=True)
class _Call(Generic[T, R]):
    item: T
    result: asyncio.Future[R] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class GroupCommit(Generic[T, R]):
    """Runs `run_batch` over the calls that queued up, one batch at a time.

    `run_batch` gets the items in arrival order and returns one result per item (an
    `Exception` instance fails that call alone); if it raises, every call of the batch fails
    with that error, unless `split_on(error)` says the batch should be retried call by call.
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], Awaitable[Sequence[R | Exception]]],
        *,
        max_batch: int,
        split_on: Callable[[Exception], bool] | None = None,
        abandoned: Callable[[T, R], None] | None = None,
    ) -> None:
        self._run_batch = run_batch
        self.max_batch = max_batch
        self._split_on = split_on
        self._abandoned = abandoned
        self._queue: deque[_Call[T, R]] = deque()
        self._runner: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        """Run `item` in the next batch; its result once the batch has finished."""
        result = self.enqueue(item)
        try:
            return await result
        except asyncio.CancelledError:
            # Cancelled after the batch finished but before this caller resumed: the result
            # is nobody's (cancelled while the batch ran is handled in `_settle`).
            if result.done() and not result.cancelled() and result.exception() is None:
                self._abandon(item, result.result())
            raise

    def enqueue(self, item: T) -> asyncio.Future[R]:
        """Queue `item` without waiting; the future is resolved when its batch finished."""
        call: _Call[T, R] = _Call(item)
        self._queue.append(call)
        if self._runner is None:
            self._runner = asyncio.create_task(self._run_queued(), name="group-commit")
        return call.result

    async def drained(self) -> None:
        """Wait until every call queued so far has finished."""
        while self._runner is not None:
            await asyncio.wait({self._runner})

    async def _run_queued(self) -> None:
        try:
            while self._queue:
                batch: list[_Call[T, R]] = []
                while self._queue and len(batch) < self.max_batch:
                    call = self._queue.popleft()
                    if not call.result.cancelled():
                        batch.append(call)
                if batch:
                    await self._run(batch)
        except BaseException:
            # Cancelled (the event loop is closing): nobody is left to run the queued calls.
            for call in self._queue:
                call.result.cancel()
            self._queue.clear()
            raise
        finally:
            self._runner = None

    async def _run(self, batch: list[_Call[T, R]]) -> None:
        try:
            results = await self._run_batch([call.item for call in batch])
        except Exception as exc:  # noqa: BLE001 (not swallowed: every caller of the batch gets it)
            if len(batch) > 1 and self._split_on is not None and self._split_on(exc):
                for call in batch:
                    await self._run([call])
                return
            for call in batch:
                self._settle(call, exc)
            return
        except BaseException:
            for call in batch:
                call.result.cancel()
            raise
        for call, result in zip(batch, results, strict=True):
            self._settle(call, result)

    def _abandon(self, item: T, result: R) -> None:
        if self._abandoned is not None:
            self._abandoned(item, result)

    def _settle(self, call: _Call[T, R], result: R | Exception) -> None:
        if call.result.cancelled():
            if not isinstance(result, Exception):
                self._abandon(call.item, result)
            return
        if isinstance(result, Exception):
            call.result.set_exception(result)
            # Retrieved here too, so a caller that was never awaited (`enqueue`) does not
            # leave "exception was never retrieved" behind.
            with suppress(Exception):
                call.result.exception()
        else:
            call.result.set_result(result)
