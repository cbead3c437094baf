"""Group commit: what queues up during a batch is the next batch, each caller gets its own
result or the batch's error, and results nobody waits for any more are handed back."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.exc import DataError, OperationalError

from errors import StorageError
from storage.group_commit import GroupCommit, refused_for_its_content


class Recorder:
    """A batch function that doubles numbers, remembers its batches and can be held open."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.started = asyncio.Event()

    async def __call__(self, items: list[int]) -> list[int | Exception]:
        self.batches.append(items)
        self.started.set()
        await self.gate.wait()
        if any(item < 0 for item in items):
            if len(items) > 1:
                raise StorageError("refused") from DataError("INSERT", {}, Exception("bad"))
            return [ValueError(f"negative: {items[0]}")]
        return [item * 2 for item in items]


async def test_calls_made_together_run_as_one_batch_and_later_ones_as_the_next() -> None:
    run = Recorder()
    batcher: GroupCommit[int, int] = GroupCommit(run, max_batch=100)
    run.gate.clear()
    first = asyncio.gather(*(batcher.submit(n) for n in range(3)))
    await run.started.wait()
    second = asyncio.gather(*(batcher.submit(n) for n in range(3, 8)))
    await asyncio.sleep(0)
    run.gate.set()

    assert await first == [0, 2, 4]
    assert await second == [6, 8, 10, 12, 14]
    assert run.batches == [[0, 1, 2], [3, 4, 5, 6, 7]]


async def test_a_batch_is_never_larger_than_max_batch() -> None:
    run = Recorder()
    batcher: GroupCommit[int, int] = GroupCommit(run, max_batch=4)

    assert await asyncio.gather(*(batcher.submit(n) for n in range(10))) == [
        n * 2 for n in range(10)
    ]
    assert [len(batch) for batch in run.batches] == [4, 4, 2]


async def test_a_failed_batch_fails_every_caller_with_its_error() -> None:
    async def unreachable(items: list[int]) -> list[int]:
        raise StorageError("database is down") from OperationalError("", {}, Exception("down"))

    batcher: GroupCommit[int, int] = GroupCommit(
        unreachable, max_batch=10, split_on=refused_for_its_content
    )
    results = await asyncio.gather(*(batcher.submit(n) for n in range(3)), return_exceptions=True)

    assert [str(result) for result in results] == ["database is down"] * 3


async def test_a_batch_refused_for_its_content_is_retried_call_by_call() -> None:
    run = Recorder()
    batcher: GroupCommit[int, int] = GroupCommit(
        run, max_batch=10, split_on=refused_for_its_content
    )
    results = await asyncio.gather(*(batcher.submit(n) for n in (1, -1, 2)), return_exceptions=True)

    assert results[0] == 2
    assert isinstance(results[1], ValueError)
    assert results[2] == 4
    assert run.batches == [[1, -1, 2], [1], [-1], [2]]


async def test_a_caller_cancelled_before_its_batch_is_left_out() -> None:
    run = Recorder()
    batcher: GroupCommit[int, int] = GroupCommit(run, max_batch=10)
    run.gate.clear()
    first = asyncio.create_task(batcher.submit(1))
    await run.started.wait()
    gone = asyncio.create_task(batcher.submit(2))
    kept = asyncio.create_task(batcher.submit(3))
    await asyncio.sleep(0)
    gone.cancel()
    run.gate.set()

    assert (await first, await kept) == (2, 6)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert run.batches == [[1], [3]]


@pytest.mark.parametrize("cancel_after_the_batch", [False, True])
async def test_a_result_nobody_takes_any_more_is_handed_to_abandoned(
    cancel_after_the_batch: bool,
) -> None:
    run = Recorder()
    abandoned: list[tuple[int, int]] = []
    batcher: GroupCommit[int, int] = GroupCommit(
        run, max_batch=10, abandoned=lambda item, result: abandoned.append((item, result))
    )
    run.gate.clear()
    gone = asyncio.create_task(batcher.submit(1))
    kept = asyncio.create_task(batcher.submit(2))
    await run.started.wait()
    if cancel_after_the_batch:
        # The batch finishes first; the caller is cancelled before it could resume.
        run.gate.set()
        await asyncio.sleep(0)  # the batch finishes and settles `gone` (not yet resumed)
    gone.cancel()
    run.gate.set()

    with pytest.raises(asyncio.CancelledError):
        await gone
    assert await kept == 4
    assert abandoned == [(1, 2)]


async def test_drained_waits_for_calls_nobody_awaits() -> None:
    run = Recorder()
    batcher: GroupCommit[int, int] = GroupCommit(run, max_batch=10)
    queued = [batcher.enqueue(n) for n in range(3)]

    await batcher.drained()

    assert [future.result() for future in queued] == [0, 2, 4]
