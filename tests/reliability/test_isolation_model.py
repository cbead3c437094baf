"""Isolation between users in what the model sees: Alice's turns, her memory, her recall
and her search tool never give the model Bob's words, while Bob's own question resumes his
session and reaches them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from sessions.recall_tool import SEARCH_TOOL_NAME
from tests.e2e.harness import RunningGateway, running_gateway
from tests.fakes.anthropic_api import FakeAnthropicAPI, Scripted
from tests.reliability.isolation import (
    ALICE_CODE,
    ALICE_TOKEN,
    ALICE_WORDS,
    BOB_TOKEN,
    BOB_WORDS,
    VAULT_CODE,
    WebUser,
    isolation_config,
    session_state,
)


async def archive_idle_sessions(gateway: RunningGateway, *, count: int) -> None:
    """Run the archiving job until `count` sessions were archived: a turn still writing its
    transcript after its reply holds its user's lock, and the job skips that user for now."""
    archived = 0
    async with asyncio.timeout(5):
        while archived < count:
            archived += await gateway.runtime.jobs.archive_idle_sessions()
            await asyncio.sleep(0.02)
    assert archived == count


async def test_the_model_never_sees_bobs_words_in_alices_turns(
    database_url: str, tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    config = isolation_config(
        database_url,
        tmp_path,
        llm={"provider": "anthropic", "api_key": "test-key", "base_url": fake_api.url},
        # Summaries (and memory facts) after one message; no topic calls between the turns.
        sessions={"summary_min_user_messages": 1, "topic_every_messages": 1000},
        recall={"resume_by_reference": True},
    )
    async with running_gateway(config) as gateway:
        alice, bob = WebUser(gateway, "alice", ALICE_TOKEN), WebUser(gateway, "bob", BOB_TOKEN)
        bobs = (await bob.say(BOB_WORDS))["session_id"]
        alices_first = (await alice.say(ALICE_WORDS))["session_id"]
        gateway.clock.advance(gateway.runtime.config.sessions.archive_after * 1.1)
        await archive_idle_sessions(gateway, count=2)
        assert await gateway.runtime.engine.summarise_archived_sessions() == 2

        start = len(fake_api.requests)
        # The words of Bob's summary: with anyone's recall this would resume his session.
        asked = await alice.say("Remember the vault code?")
        fake_api.script.append(
            Scripted(tool_use={"name": SEARCH_TOOL_NAME, "input": {"query": "vault code"}})
        )
        searched = await alice.say("Please look it up in our past conversations.")
        alices_requests = fake_api.requests[start:]
        bob_asked = await bob.say("Remember the vault code?")
        bobs_request = fake_api.requests[-1]
        bob_after = await session_state(gateway, "bob")

    assert asked["session_id"] not in (bobs, alices_first)
    assert searched["session_id"] == asked["session_id"]
    assert len(alices_requests) == 3  # a turn, then a tool call and the turn it led to
    for request in alices_requests:
        assert "Remember the vault code?" in json.dumps(request)  # really one of Alice's
        assert ALICE_CODE in json.dumps(request)  # her memory and recall were searched
        assert VAULT_CODE not in json.dumps(request)
        assert "4471" not in json.dumps(request)
    tool_results = [
        block
        for message in alices_requests[-1]["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert len(tool_results) == 1
    assert ALICE_CODE in json.dumps(tool_results)
    # The same question from Bob resumes his own session, and his words reach the model.
    assert bob_asked["session_id"] == bobs
    assert VAULT_CODE in json.dumps(bobs_request)
    assert [content for role, content in bob_after[bobs]["messages"] if role == "user"] == [
        BOB_WORDS,
        "Remember the vault code?",
    ]
