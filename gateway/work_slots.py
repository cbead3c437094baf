"""Work slots: how many turns may work at once, not counting their waits for the model.

A process runs many turns concurrently, but most of a turn's life is waiting for the model; the
rest (database reads and writes, building the context, the transcript) takes the event loop's
CPU, which the acknowledgements of new messages need too. A turn works inside
`WorkSlots.working()` and gives its slot up while it waits (`waiting()`, which `WaitingLLM`
applies to every model call), so at most `size` turns compete with accepting at any moment,
however many are waiting for answers.

A turn coming back from a wait takes the next free slot before any turn that has not started:
what has its answer is finished (written, replied to) before more is begun. Handed out in
arrival order alone, every answered turn queued again behind all the turns started since:
with 10,000 users writing 200 messages a second, a turn's 2-second model call was followed by
a median 1.25 s (p90 2 s) to take its slot back, once after the model and once after the
transcript (`bench/README.md`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass

from sessions.llm import LLMClient, LLMRequest, LLMResponse
from sessions.progress import TurnProgress

WORK_SLOTS = 8


@dataclass(slots=True)
class _Holding:
    held: bool = True


class _Slots:
    """A semaphore with two queues: holders coming back from a wait are served first."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._returning: deque[asyncio.Future[None]] = deque()
        self._starting: deque[asyncio.Future[None]] = deque()

    async def acquire(self, *, returning: bool) -> None:
        # A released slot goes straight to a waiter (`release`): a free one means none waits.
        if self._free > 0:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._returning if returning else self._starting
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():
                with suppress(ValueError):  # `release` may have dropped it already
                    queue.remove(waiter)
            else:
                self.release()  # handed the slot as it was cancelled: pass it on
            raise

    def release(self) -> None:
        for queue in (self._returning, self._starting):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self._free += 1


class WorkSlots:
    """A semaphore whose holder can step aside while it waits on something else."""

    def __init__(self, size: int = WORK_SLOTS) -> None:
        self.size = size
        self._slots = _Slots(size)
        self._current: ContextVar[_Holding | None] = ContextVar("work_slot", default=None)

    @asynccontextmanager
    async def working(self) -> AsyncIterator[None]:
        """Hold a slot for the block (the task's own work)."""
        await self._slots.acquire(returning=False)
        holding = _Holding()
        token = self._current.set(holding)
        try:
            yield
        finally:
            self._current.reset(token)
            if holding.held:
                self._slots.release()

    @asynccontextmanager
    async def waiting(self) -> AsyncIterator[None]:
        """Give the slot up for the block (a wait), and take one again after it.

        Outside `working()` (a background job's model call) it does nothing.
        """
        holding = self._current.get()
        if holding is None or not holding.held:
            yield
            return
        holding.held = False
        self._slots.release()
        try:
            yield
        finally:
            # Cancelled while taking it back: not held, so `working()` releases nothing.
            await self._slots.acquire(returning=True)
            holding.held = True


@asynccontextmanager
async def stepping_aside(*slots: WorkSlots) -> AsyncIterator[None]:
    """Give up the caller's slot of each of `slots` for the block, and take them back after
    it, the last given first (the outer slot before the inner one, as they were taken)."""
    async with AsyncExitStack() as stack:
        for each in slots:
            await stack.enter_async_context(each.waiting())
        yield


class WaitingLLM:
    """A model client whose calls give up the caller's work slot while they wait."""

    def __init__(self, llm: LLMClient, slots: WorkSlots) -> None:
        self.inner = llm
        self.slots = slots
        self.name = llm.name

    async def complete(
        self, request: LLMRequest, *, progress: TurnProgress | None = None
    ) -> LLMResponse:
        """The inner client's answer (streamed into `progress`), waited for without a work
        slot."""
        async with self.slots.waiting():
            if progress is None:
                return await self.inner.complete(request)
            return await self.inner.complete(request, progress=progress)

    async def close(self) -> None:
        """Close the inner client."""
        await self.inner.close()
