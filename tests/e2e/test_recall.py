"""Recall end to end: what was said in an archived session reaches a later session's turn,
through the web channel, the real `anthropic` SDK and a fake Messages API."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sessions.context import EARLIER_HEADING
from sessions.recall_tool import SEARCH_TOOL_NAME
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway
from tests.fakes.anthropic_api import FakeAnthropicAPI, Scripted

FACT = "For the Acme renewal we agreed on 4200 euros per seat, signed by Priya."


def recall_config(database_url: str, tmp_path: Path, api: FakeAnthropicAPI, **recall: Any) -> Any:
    return gateway_config(
        database_url,
        tmp_path,
        llm={"provider": "anthropic", "api_key": "test-key", "base_url": api.url},
        recall=recall,
    )


async def say(gateway: RunningGateway, text: str, expected_replies: int) -> dict[str, Any]:
    await gateway.post("alice", text)
    return (await gateway.wait_for_replies("alice", expected_replies, settle=0))[-1]


def system_of(request: dict[str, Any]) -> str:
    system = request.get("system", "")
    if isinstance(system, list):
        return " ".join(block.get("text", "") for block in system)
    return str(system)


async def archive_a_session_with_the_fact(gateway: RunningGateway) -> None:
    await say(gateway, FACT, 1)
    await say(gateway, "Thanks, that is all for today.", 2)
    reply = await say(gateway, "/new", 3)  # archives this session and starts a new one
    assert "new" in reply["text"].lower()


async def test_a_fact_from_an_archived_session_is_in_a_later_turns_context(
    database_url: str, tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    async with running_gateway(recall_config(database_url, tmp_path, fake_api)) as gateway:
        await archive_a_session_with_the_fact(gateway)
        await say(gateway, "What price did we agree for the Acme renewal?", 4)
        await say(gateway, "Hello again", 5)

    asked, unrelated = fake_api.replies[-2], fake_api.replies[-1]
    system = system_of(asked)
    assert EARLIER_HEADING in system
    earlier = system.split(EARLIER_HEADING, 1)[1]
    assert "4200 euros per seat" in earlier
    assert "Alice" in earlier  # the speaker
    # The question itself is in the messages, never repeated as an "earlier" passage.
    assert "What price did we agree" not in earlier
    assert SEARCH_TOOL_NAME in {tool["name"] for tool in asked.get("tools", [])}
    # A message with nothing to find adds nothing.
    assert EARLIER_HEADING not in system_of(unrelated)


async def test_the_model_can_search_past_conversations_with_the_tool(
    database_url: str, tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    config = recall_config(database_url, tmp_path, fake_api, auto_hits=0)
    async with running_gateway(config) as gateway:
        await archive_a_session_with_the_fact(gateway)
        fake_api.script.append(
            Scripted(
                tool_use={
                    "name": SEARCH_TOOL_NAME,
                    "input": {"query": "Acme renewal price", "since": "2000-01-01"},
                }
            )
        )
        await say(gateway, "Remind me what we said about Acme?", 4)

    call, after = fake_api.replies[-2], fake_api.replies[-1]
    assert EARLIER_HEADING not in system_of(call)  # auto_hits: 0
    results = [
        block
        for message in after["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert len(results) == 1
    assert "4200 euros per seat" in json.dumps(results[0])
    assert not results[0].get("is_error")


async def test_with_recall_disabled_turns_get_neither_passages_nor_the_tool(
    tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
    async with running_gateway(recall_config(url, tmp_path, fake_api, enabled=False)) as gateway:
        await archive_a_session_with_the_fact(gateway)
        await say(gateway, "What price did we agree for the Acme renewal?", 4)
    asked = fake_api.replies[-1]
    assert EARLIER_HEADING not in system_of(asked)
    assert SEARCH_TOOL_NAME not in {tool["name"] for tool in asked.get("tools", [])}


async def sessions_of_alice(gateway: RunningGateway) -> list[tuple[str, str]]:
    rows = await gateway.runtime.admin.list_sessions(user_id="alice")
    return [(row["session_id"], row["status"]) for row in rows]


@pytest.mark.parametrize("resume", [True, False], ids=["resume_on", "resume_off"])
async def test_a_message_that_continues_an_archived_session_goes_back_to_it_when_enabled(
    tmp_path: Path, resume: bool
) -> None:
    config = gateway_config(
        f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        tmp_path,
        sessions={"summary_min_user_messages": 1},
        recall={"resume_by_reference": resume},
    )
    async with running_gateway(config) as gateway:
        await say(gateway, FACT, 1)
        # The job skips a user whose turn still holds the lock after its reply was stored.
        await gateway.wait_for_turns_to_end("alice")
        gateway.clock.advance(timedelta(days=2))
        assert await gateway.runtime.jobs.archive_idle_sessions() == 1
        await gateway.runtime.engine.summarise_archived_sessions()
        ((archived, status),) = await sessions_of_alice(gateway)
        assert status == "archived"
        await say(gateway, "About the Acme renewal: who signed it and at what price per seat?", 2)
        await say(gateway, "Unrelated: recommend a good book about volcanoes.", 3)
        sessions = await sessions_of_alice(gateway)
    if resume:
        # The follow-up reopened the archived session; the unrelated message stayed in it too,
        # since the reopened session is now the user's current one.
        assert sessions == [(archived, "active")]
    else:
        assert len(sessions) == 2
        assert (archived, "archived") in sessions
