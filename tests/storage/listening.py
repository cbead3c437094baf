"""Running a notification listener (`storage.notifications.Listener`) for a test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from storage.notifications import Listener


async def until(condition: Callable[[], bool]) -> None:
    """Wait (at most 10 s) until `condition()` holds."""
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(listener: Listener, heard: list[str | None]) -> AsyncIterator[list[str | None]]:
    """The listener running for the block, from once it has connected (`heard` begins with
    the None it calls back with then); `heard` is what its callback records."""
    task = asyncio.create_task(listener.run())
    await until(lambda: heard[:1] == [None])
    try:
        yield heard
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
