"""The session engine end to end: the real `anthropic` SDK against a fake Messages API,
the web channel in front, and the transcript store behind."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer
from sqlalchemy import select

from sessions.engine import COMPACTION_NOTICE, SUGGEST_NEW_NOTICE
from sessions.engine_values import Tool
from sessions.llm import ToolSpec
from storage.models import InboundEvent, Session, SessionCompaction, SessionMessage, UserMemoryFact
from tests.e2e.harness import RunningGateway, free_port, gateway_config, running_gateway
from tests.fakes.anthropic_api import FakeAnthropicAPI, Scripted

FILLER = "lorem ipsum dolor sit amet " * 12  # about 80 tokens


@pytest.fixture
def fake_api() -> Iterator[FakeAnthropicAPI]:
    with FakeAnthropicAPI() as api:
        yield api


def engine_config(
    database_url: str,
    tmp_path: Path,
    api: FakeAnthropicAPI,
    storage: dict[str, Any] | None = None,
    **sessions: Any,
) -> Any:
    extra = {"storage": storage} if storage else {}
    return gateway_config(
        database_url,
        tmp_path,
        llm={
            "provider": "anthropic",
            "api_key": "test-key",
            "base_url": api.url,
            "max_retries": 2,
            "timeout": "10s",
        },
        sessions={
            "history_budget_tokens": 3000,
            "compaction": {"keep_last_messages": 20},
            **sessions,
        },
        **extra,
    )


async def say(gateway: RunningGateway, text: str, expected_replies: int) -> dict[str, Any]:
    """Send one message and return its reply (a surplus reply fails the next `say`)."""
    await gateway.post("alice", text)
    return (await gateway.wait_for_replies("alice", expected_replies, settle=0))[-1]


def text_of(request: dict[str, Any]) -> str:
    return json.dumps(request["messages"]) + json.dumps(request.get("system", ""))


async def test_crossing_the_budget_compacts_with_the_archive_written_first(
    database_url: str, tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    store = tmp_path / "transcripts"
    archives_seen_at_summary: list[bool] = []

    async with running_gateway(engine_config(database_url, tmp_path, fake_api)) as gateway:

        def watch(body: dict[str, Any]) -> None:
            if str(body.get("system", "")).startswith("Summarise the conversation below"):
                archives = list(store.glob("sessions/*/*/*/archive/full_transcript_pre_compact_*"))
                archives_seen_at_summary.append(bool(archives))

        fake_api.on_request = watch
        n = 0
        reply: dict[str, Any] = {}
        while COMPACTION_NOTICE not in reply.get("text", ""):
            n += 1
            assert n < 60, "no compaction after 60 messages"
            reply = await say(gateway, f"marker-{n:03d} {FILLER}", n)
        await say(gateway, f"marker-{n + 1:03d} after the compaction", n + 1)
        async with gateway.runtime.database.session() as db:
            (compaction,) = (await db.execute(select(SessionCompaction))).scalars()
            (session,) = (await db.execute(select(Session))).scalars()
            stored = list((await db.execute(select(SessionMessage))).scalars())

    assert archives_seen_at_summary == [True]
    assert compaction.seq == 1
    assert session.compaction_count == 1
    assert session.status == "active"
    assert len(stored) == 2 * (n + 1)  # nothing leaves the database
    archive = store / compaction.archive_ref
    assert archive.name == "full_transcript_pre_compact_001.jsonl"
    # Every stored message: the message of the compacting turn is stored with its answer.
    assert len(archive.read_text().splitlines()) == 2 * (n - 1)
    assert (archive.parent.parent / "compact_001.json").exists()

    last = fake_api.replies[-1]
    sent = text_of(last)
    assert "<summary>" in json.dumps(last["messages"][1])
    kept_markers = {f"marker-{i:03d}" for i in range(1, n + 2) if f"marker-{i:03d}" in sent}
    assert f"marker-{n + 1:03d}" in kept_markers
    # The compacted messages' text is gone from the messages (only the summary carries it).
    first_kept = compaction.last_message_seq + 1
    assert len(last["messages"]) - 2 == (2 * (n + 1) - 1) - first_kept + 1
    for message in last["messages"][2:]:
        for i in range(1, (first_kept + 1) // 2):
            assert f"marker-{i:03d} " not in json.dumps(message)


async def test_with_s3_down_at_precompact_nothing_is_dropped_and_it_retries(
    tmp_path: Path, fake_api: FakeAnthropicAPI, s3_endpoint: str
) -> None:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    s3.start()
    boto3.session.Session(region_name="us-east-1").client(
        "s3", endpoint_url=endpoint
    ).create_bucket(Bucket="transcripts")
    config = engine_config(
        f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
        tmp_path,
        fake_api,
        compaction={"trigger_ratio": 0.5, "keep_last_messages": 20},
        storage={
            "database_url": f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
            "transcripts": {
                "backend": "s3",
                "s3": {"bucket": "transcripts", "endpoint_url": endpoint, "region": "us-east-1"},
            },
        },
    )
    try:
        async with running_gateway(config) as gateway:
            await say(gateway, f"marker-001 {FILLER}", 1)
            s3.stop()  # S3 is down from here on
            for n in range(2, 15):
                reply = await say(gateway, f"marker-{n:03d} {FILLER}", n)
                assert COMPACTION_NOTICE not in reply["text"]
            sent = text_of(fake_api.replies[-1])
            assert all(f"marker-{n:03d}" in sent for n in range(1, 15))  # nothing dropped
            async with gateway.runtime.database.session() as db:
                session = (await db.execute(select(Session))).scalar_one()
            assert (session.status, session.compaction_count) == ("active", 0)
            assert session.context_tokens > 0.5 * 3000  # it was over the trigger all along

            s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            s3.start()  # moto keeps its state in the process: the bucket is back
            reply = await say(gateway, "marker-015 S3 is back", 15)
            async with gateway.runtime.database.session() as db:
                session = (await db.execute(select(Session))).scalar_one()
                (compaction,) = (await db.execute(select(SessionCompaction))).scalars()
    finally:
        s3.stop()
    assert COMPACTION_NOTICE in reply["text"]
    assert session.compaction_count == 1
    assert compaction.archive_ref.endswith("archive/full_transcript_pre_compact_001.jsonl")


async def test_a_fact_from_message_three_reaches_turn_one_hundred_fifty(
    tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    config = engine_config(
        f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
        tmp_path,
        fake_api,
        history_budget_tokens=4000,
        compaction={"keep_last_messages": 20, "max_messages": 60},
    )
    async with running_gateway(config) as gateway:
        for n in range(1, 151):
            text = f"note {n}: {FILLER[:120]}"
            if n == 2:
                text = "Please remember that my favourite colour is teal."
            await say(gateway, text, n)
        async with gateway.runtime.database.session() as db:
            compactions = list((await db.execute(select(SessionCompaction))).scalars())
            facts = [f.fact for f in (await db.execute(select(UserMemoryFact))).scalars()]
    assert len(compactions) >= 2
    last = fake_api.replies[-1]
    assert "favourite colour is teal" in text_of(last)
    assert any("teal" in fact for fact in facts)


async def test_an_archived_sessions_summary_is_in_the_next_sessions_context(
    database_url: str, tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    async with running_gateway(engine_config(database_url, tmp_path, fake_api)) as gateway:
        topics = ["the Acme renewal", "pricing for Acme", "the Acme contract draft"]
        for n, topic in enumerate(topics * 2, start=1):
            await say(gateway, f"Let us talk about {topic}. I will send it Friday.", n)
        await say(gateway, "/new", 7)
        assert await gateway.runtime.engine.summarise_archived_sessions() == 1
        await say(gateway, "What did we discuss last time?", 8)
    system = fake_api.replies[-1]["system"]
    assert "Recent conversations:" in system
    assert "Acme renewal" in system.split("Recent conversations:")[1]


async def test_model_errors_are_retried_then_apologised_for_and_the_message_is_kept(
    database_url: str, tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    async with running_gateway(engine_config(database_url, tmp_path, fake_api)) as gateway:
        fake_api.script.extend(
            [Scripted(status=429, error_type="rate_limit_error", headers={"retry-after": "0"})]
        )
        reply = await say(gateway, "first question", 1)
        assert reply["text"].startswith("Claude here.")
        assert len(fake_api.requests) == 2  # the 429 was retried by the SDK

        fake_api.script.extend([Scripted(status=529, headers={"retry-after": "0"})] * 3)
        reply = await say(gateway, "second question", 2)
        assert "could not get an answer" in reply["text"]

        reply = await say(gateway, "third question", 3)
        assert "second question" in text_of(fake_api.replies[-1])
        async with gateway.runtime.database.session() as db:
            statuses = [e.status for e in (await db.execute(select(InboundEvent))).scalars()]
            roles = list(
                (
                    await db.execute(select(SessionMessage.role).order_by(SessionMessage.seq))
                ).scalars()
            )
    assert statuses == ["done", "failed", "done"]
    assert roles == ["user", "assistant", "user", "user", "assistant"]


async def test_a_long_session_suggests_starting_a_new_one(
    tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    config = engine_config(
        f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}", tmp_path, fake_api, archive_after="24h"
    )
    async with running_gateway(config) as gateway:
        first = await say(gateway, "hello", 1)
        gateway.clock.advance(timedelta(hours=9))
        later = await say(gateway, "still here", 2)
    assert SUGGEST_NEW_NOTICE not in first["text"]
    assert later["text"].endswith(SUGGEST_NEW_NOTICE)


async def test_the_topic_is_tracked_every_five_messages(
    database_url: str, tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    config = engine_config(database_url, tmp_path, fake_api)
    async with running_gateway(config) as gateway:
        await say(gateway, "Planning the quarterly budget review for marketing.", 1)
        await say(gateway, "The budget review needs marketing numbers.", 2)
        async with gateway.runtime.database.session() as db:
            before = (await db.execute(select(Session))).scalar_one()
            assert before.topic_summary == ""
        await say(gateway, "Marketing budget numbers arrive Monday.", 3)
        for _ in range(100):  # the topic is updated just after the reply is committed
            async with gateway.runtime.database.session() as db:
                session = (await db.execute(select(Session))).scalar_one()
            if session.topic_summary:
                break
            await asyncio.sleep(0.05)
    assert session.topic_summary.startswith("Planning the quarterly budget review")
    assert "budget" in session.topics
    assert 3 <= len(session.topics) <= 5


async def test_a_tool_call_and_its_result_are_stored_and_sent_back_exactly(
    database_url: str, tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    calls: list[tuple[dict[str, Any], str]] = []

    async def lookup(arguments: Any, user_id: str) -> str:
        calls.append((dict(arguments), user_id))
        return "Acme renewal is due on 1 March."

    tool = Tool(
        ToolSpec(
            "lookup_account",
            "Look up an account.",
            {"type": "object", "properties": {"name": {"type": "string"}}},
        ),
        lookup,
    )
    async with running_gateway(engine_config(database_url, tmp_path, fake_api)) as gateway:
        gateway.runtime.engine.tools = {"lookup_account": tool}
        fake_api.script.append(
            Scripted(tool_use={"name": "lookup_account", "input": {"name": "Acme"}})
        )
        reply = await say(gateway, "When is the Acme renewal?", 1)
        await say(gateway, "Thanks!", 2)
        async with gateway.runtime.database.session() as db:
            stored = list(
                (await db.execute(select(SessionMessage).order_by(SessionMessage.seq))).scalars()
            )
    assert calls == [({"name": "Acme"}, "alice")]
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"] * 1 + [
        "user",
        "assistant",
    ]
    tool_use = stored[1].metadata_json["blocks"][1]
    tool_result = stored[2].metadata_json["blocks"][0]
    assert tool_use["type"] == "tool_use"
    assert tool_result == {
        "type": "tool_result",
        "tool_use_id": tool_use["id"],
        "content": "Acme renewal is due on 1 March.",
    }
    assert reply["text"].startswith("Claude here.")
    second_turn = fake_api.replies[-1]["messages"]
    assert second_turn[1] == {"role": "assistant", "content": stored[1].metadata_json["blocks"]}
    assert second_turn[2] == {"role": "user", "content": [tool_result]}
    assert second_turn[1]["content"][1]["input"] == {"name": "Acme"}


async def test_the_leader_job_finishes_compactions_that_had_to_wait(
    database_url: str, tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    config = engine_config(
        database_url,
        tmp_path,
        fake_api,
        history_budget_tokens=50_000,
        compaction={"keep_last_messages": 4},
    )
    async with running_gateway(config) as gateway:
        jobs = gateway.runtime.jobs
        await say(gateway, "one", 1)

        async def force(status: str, context_tokens: int) -> None:
            async with gateway.runtime.database.session() as db:
                session = (await db.execute(select(Session))).scalar_one()
                session.status, session.context_tokens = status, context_tokens

        async def stored() -> Session:
            async with gateway.runtime.database.session() as db:
                return (await db.execute(select(Session))).scalar_one()

        async def retry_when_the_turn_is_over() -> int:
            # The job skips a user whose turn lock is held; the last turn may still be
            # finishing its bookkeeping after its reply went out.
            for _ in range(100):
                async with gateway.runtime.dispatcher.locks.hold("user:alice") as free:
                    if free:
                        break
                await asyncio.sleep(0.05)
            return await jobs.retry_deferred_compactions()

        await force("compacting", 10)  # as a crash in the middle of a compaction leaves it
        assert await retry_when_the_turn_is_over() == 0  # too little to compact
        assert (await stored()).status == "active"

        for n in range(2, 6):
            await say(gateway, f"message {n}", n)
        await force("active", 45_000)  # over the trigger, as when the archive had to wait
        assert await retry_when_the_turn_is_over() == 1
        session = await stored()
        assert (session.status, session.compaction_count) == ("active", 1)
        assert session.context_tokens < 40_000
        assert await jobs.retry_deferred_compactions() == 0
