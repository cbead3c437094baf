"""Work slots: a bounded number of turns work at once; waiting for the model frees the slot."""

from __future__ import annotations

import asyncio

from gateway.work_slots import WaitingLLM, WorkSlots
from sessions.llm import LLMMessage, LLMRequest, LLMResponse, OfflineLLM


async def most_working_at_once(slots: WorkSlots, turns: int) -> int:
    """Run `turns` turns that each work briefly; the most that were at work at once."""
    working = 0
    most = 0

    async def turn() -> None:
        nonlocal working, most
        async with slots.working():
            working += 1
            most = max(most, working)
            await asyncio.sleep(0.01)
            working -= 1

    await asyncio.gather(*(turn() for _ in range(turns)))
    return most


async def test_no_more_than_the_slots_work_at_once() -> None:
    assert await most_working_at_once(WorkSlots(2), 10) == 2


async def test_turns_waiting_for_the_model_do_not_hold_a_slot() -> None:
    slots = WorkSlots(1)
    model_answers = asyncio.Event()
    waiting = 0

    async def turn() -> None:
        nonlocal waiting
        async with slots.working(), slots.waiting():
            waiting += 1
            await model_answers.wait()

    turns = [asyncio.create_task(turn()) for _ in range(5)]
    async with asyncio.timeout(5):
        while waiting < 5:
            await asyncio.sleep(0.001)
    # All five wait for the model at once, with one slot; none works meanwhile.
    model_answers.set()
    await asyncio.gather(*turns)
    async with asyncio.timeout(1), slots.working():
        pass  # the slot came back


async def test_a_turn_cancelled_while_taking_its_slot_back_releases_nothing_twice() -> None:
    slots = WorkSlots(1)
    in_wait = asyncio.Event()
    answered = asyncio.Event()

    async def turn() -> None:
        async with slots.working(), slots.waiting():
            in_wait.set()
            await answered.wait()

    task = asyncio.create_task(turn())
    await asyncio.wait_for(in_wait.wait(), timeout=5)
    async with slots.working():
        # The turn's wait is over, but the slot it gave up is held here: it blocks taking it
        # back, and is cancelled there.
        answered.set()
        await asyncio.sleep(0.01)
        assert not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # Exactly one slot exists: two at work at once would mean it was released twice.
    assert await most_working_at_once(slots, 3) == 1


async def test_model_calls_outside_a_turn_pass_through() -> None:
    llm = WaitingLLM(OfflineLLM(), WorkSlots(1))
    request = LLMRequest(system="", messages=(LLMMessage("user", "hello"),), max_tokens=100)
    answer = await llm.complete(request)
    assert isinstance(answer, LLMResponse)
    assert "hello" in answer.text
    assert llm.name == "offline"
    await llm.close()


async def test_a_turn_back_from_its_wait_goes_before_turns_not_started() -> None:
    slots = WorkSlots(1)
    order: list[str] = []
    answered = asyncio.Event()
    in_wait = asyncio.Event()

    async def answered_turn() -> None:
        async with slots.working():
            async with slots.waiting():
                in_wait.set()
                await answered.wait()
            order.append("answered")

    async def new_turn(name: str) -> None:
        async with slots.working():
            order.append(name)

    first = asyncio.create_task(answered_turn())
    await asyncio.wait_for(in_wait.wait(), timeout=5)
    async with slots.working():
        # While the slot is held here, two turns queue to start and then the answered one
        # comes back from its wait.
        newcomers = [asyncio.create_task(new_turn(f"new {n}")) for n in (1, 2)]
        await asyncio.sleep(0.01)
        answered.set()
        await asyncio.sleep(0.01)
        assert order == []
    await asyncio.wait_for(asyncio.gather(first, *newcomers), timeout=5)
    assert order == ["answered", "new 1", "new 2"]


async def test_a_turn_cancelled_while_queued_to_start_takes_no_slot() -> None:
    slots = WorkSlots(1)
    started = asyncio.Event()

    async def new_turn() -> None:
        async with slots.working():
            started.set()

    async with slots.working():
        queued = asyncio.create_task(new_turn())
        await asyncio.sleep(0.01)
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
    assert not started.is_set()
    assert await most_working_at_once(slots, 3) == 1


async def test_a_slot_handed_to_a_turn_as_it_is_cancelled_goes_to_the_next() -> None:
    slots = WorkSlots(1)
    ran: list[str] = []

    async def new_turn(name: str) -> None:
        async with slots.working():
            ran.append(name)

    held = slots.working()
    await held.__aenter__()
    first = asyncio.create_task(new_turn("first"))
    second = asyncio.create_task(new_turn("second"))
    await asyncio.sleep(0.01)
    # The release hands the slot to the first queued turn, which is cancelled before it runs.
    await held.__aexit__(None, None, None)
    first.cancel()
    await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), timeout=5)
    assert ran == ["second"]
    assert await most_working_at_once(slots, 3) == 1
