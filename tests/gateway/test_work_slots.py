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
