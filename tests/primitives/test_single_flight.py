"""Single flight: one run per key at a time, and every request made while a run is under
way is answered by exactly one further run, started once the current one ends."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable

import pytest

from primitives.single_flight import SingleFlight


class Runner:
    """Runs work per key the way the dispatcher drains users' queues: a task per run,
    started through `SingleFlight`, asking again when it ends if it was asked meanwhile."""

    def __init__(self, *, gated: bool = True, seed: int = 0) -> None:
        self.flights = SingleFlight()
        self.gated = gated
        self.random = random.Random(seed)
        self.log: list[tuple[str, str]] = []  # ("request" | "start" | "end", key), in order
        self.running: Counter[str] = Counter()
        self.most_at_once: Counter[str] = Counter()
        self.proceed: dict[str, asyncio.Queue[None]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def request(self, key: str) -> None:
        self.log.append(("request", key))
        self._begin(key)

    def finish_one(self, key: str) -> None:
        """Let one (current or future) run of `key` end."""
        self._gate(key).put_nowait(None)

    async def settle(self) -> None:
        """Wait until no run is under way or about to start."""
        while self.tasks:
            await asyncio.gather(*self.tasks)

    def runs(self, key: str) -> int:
        return self.log.count(("start", key))

    def _begin(self, key: str) -> None:
        if self.flights.begin(key):
            task = asyncio.create_task(self._run(key))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _gate(self, key: str) -> asyncio.Queue[None]:
        return self.proceed.setdefault(key, asyncio.Queue())

    async def _run(self, key: str) -> None:
        self.log.append(("start", key))
        self.running[key] += 1
        self.most_at_once[key] = max(self.most_at_once[key], self.running[key])
        try:
            if self.gated:
                await self._gate(key).get()
            else:
                for _ in range(self.random.randint(0, 5)):
                    await asyncio.sleep(0)
        finally:
            self.running[key] -= 1
            self.log.append(("end", key))
            if self.flights.end(key):
                self._begin(key)


async def until(condition: Callable[[], bool]) -> None:
    """Let the other tasks run until `condition()` holds (a bounded number of steps)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def test_the_first_request_starts_a_run_and_the_next_ones_ask_for_one_more() -> None:
    flights = SingleFlight()
    assert flights.begin("u") is True
    assert (flights.is_running("u"), flights.rerun_requested("u")) == (True, False)
    assert flights.begin("u") is False
    assert flights.begin("u") is False
    assert flights.rerun_requested("u") is True
    assert flights.end("u") is True
    assert (flights.is_running("u"), flights.rerun_requested("u")) == (False, False)


def test_a_run_nobody_asked_for_again_ends_for_good() -> None:
    flights = SingleFlight()
    flights.begin("u")
    assert flights.end("u") is False
    assert flights.is_running("u") is False
    assert flights.begin("u") is True  # a later request starts afresh


def test_a_rerun_the_caller_lets_go_leaves_the_key_free() -> None:
    flights = SingleFlight()
    flights.begin("u")
    flights.begin("u")
    assert flights.end("u") is True  # the caller is shutting down and starts nothing
    assert (flights.is_running("u"), flights.rerun_requested("u")) == (False, False)
    assert flights.begin("u") is True


def test_keys_are_independent() -> None:
    flights = SingleFlight()
    assert (flights.begin("a"), flights.begin("b")) == (True, True)
    flights.begin("a")
    assert (flights.rerun_requested("a"), flights.rerun_requested("b")) == (True, False)
    assert flights.end("b") is False
    assert flights.is_running("a") is True


def test_ending_a_run_that_never_began_is_a_mistake() -> None:
    flights = SingleFlight()
    with pytest.raises(KeyError, match="no run"):
        flights.end("u")
    flights.begin("u")
    flights.end("u")
    with pytest.raises(KeyError, match="no run"):
        flights.end("u")


async def test_requests_from_many_tasks_during_a_run_collapse_into_one_more_run() -> None:
    runner = Runner()
    runner.request("u")
    await until(lambda: runner.running["u"] == 1)

    async def ask() -> None:
        await asyncio.sleep(0)
        runner.request("u")

    await asyncio.gather(*(ask() for _ in range(50)))
    assert runner.runs("u") == 1  # still the first run: nothing started beside it
    runner.finish_one("u")
    await until(lambda: runner.runs("u") == 2)
    runner.finish_one("u")
    await runner.settle()
    assert runner.runs("u") == 2
    assert runner.most_at_once["u"] == 1


async def test_a_request_during_the_second_run_gets_a_third() -> None:
    runner = Runner()
    runner.request("u")
    await until(lambda: runner.running["u"] == 1)
    runner.request("u")
    runner.finish_one("u")
    await until(lambda: runner.runs("u") == 2)
    runner.request("u")
    runner.finish_one("u")
    runner.finish_one("u")
    await runner.settle()
    assert runner.runs("u") == 3
    assert runner.most_at_once["u"] == 1


async def test_a_request_after_a_run_ended_starts_a_new_one_at_once() -> None:
    runner = Runner()
    runner.request("u")
    runner.finish_one("u")
    await runner.settle()
    runner.request("u")
    await until(lambda: runner.running["u"] == 1)
    runner.finish_one("u")
    await runner.settle()
    assert runner.runs("u") == 2


async def test_runs_of_different_keys_go_side_by_side() -> None:
    runner = Runner()
    runner.request("a")
    runner.request("b")
    await until(lambda: runner.running["a"] == 1 and runner.running["b"] == 1)
    runner.finish_one("a")
    runner.finish_one("b")
    await runner.settle()
    assert (runner.runs("a"), runner.runs("b")) == (1, 1)


@pytest.mark.parametrize("seed", range(5))
async def test_under_random_interleavings_no_request_is_left_without_a_later_run(
    seed: int,
) -> None:
    runner = Runner(gated=False, seed=seed)
    keys = ["a", "b", "c"]
    schedule = random.Random(seed)

    async def client() -> None:
        for _ in range(20):
            for _ in range(schedule.randint(0, 3)):
                await asyncio.sleep(0)
            runner.request(schedule.choice(keys))

    await asyncio.gather(*(client() for _ in range(10)))
    await runner.settle()

    for key in keys:
        events = [kind for kind, of in runner.log if of == key]
        last_request = max(i for i, kind in enumerate(events) if kind == "request")
        assert "start" in events[last_request + 1 :], f"a request for {key} was lost"
        assert runner.most_at_once[key] == 1
        assert 0 < runner.runs(key) <= events.count("request")
    assert (runner.flights.is_running("a"), runner.flights.rerun_requested("a")) == (False, False)
