"""What the engine tells a turn's progress: thinking before each model call, compacting before
a compaction, the model's text as it streams, and a reset then the tool's status before each
tool runs; over the real SDK against the fake Messages API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sessions.anthropic_llm import AnthropicLLM
from sessions.compaction import CompactionPolicy, Compactor
from sessions.engine import COMPACTION_NOTICE, SessionEngine
from sessions.engine_values import EngineSettings, RecallSettings, Tool
from sessions.llm import ToolSpec
from sessions.recall_tool import SEARCH_TOOL_NAME
from storage.database import Database
from storage.local_transcripts import LocalTranscriptStore
from storage.repositories.sessions import SessionRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from tests.fakes.anthropic_api import FakeAnthropicAPI, Scripted, claude
from tests.sessions.recorded_progress import RecordedProgress

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
LOOKUP = ToolSpec(
    "lookup_account",
    "Look an account up.",
    {"type": "object", "properties": {"name": {"type": "string"}}},
)


@pytest.fixture
async def llm(api: FakeAnthropicAPI) -> AsyncIterator[AnthropicLLM]:
    client = claude(api)
    yield client
    await client.close()


class ToolLog:
    """The lookup tool; notes how much progress it had seen when it ran."""

    def __init__(self, progress: RecordedProgress) -> None:
        self.progress = progress
        self.seen_at_run: list[int] = []

    async def run(self, tool_input: Mapping[str, Any], user_id: str) -> str:
        self.seen_at_run.append(len(self.progress.calls))
        return f"{tool_input.get('name')} is owned by Bob."


def make_engine(
    database: Database,
    tmp_path: Path,
    llm: AnthropicLLM,
    policy: CompactionPolicy,
    tools: tuple[Tool, ...] = (),
) -> SessionEngine:
    return SessionEngine(
        database,
        Compactor(database, LocalTranscriptStore(tmp_path), llm, policy, clock=lambda: T0),
        llm,
        EngineSettings(system_prompt="Be brief.", max_tokens=500, compaction=policy),
        clock=lambda: T0 + timedelta(minutes=30),
        tools=tools,
        recall=RecallSettings(auto_hits=0, tool=True),
    )


async def session_with(database: Database, texts: list[str]) -> str:
    """A session whose messages alternate user/assistant, starting and ending with the user."""
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("alice", "acme", "Alice")
        sessions = SessionRepository(db)
        session = await sessions.create("alice", "acme", at=T0)
        for index, text in enumerate(texts):
            await sessions.append_message(
                session.id,
                role="user" if index % 2 == 0 else "assistant",
                channel_type="web",
                content=text,
                at=T0 + timedelta(minutes=index),
            )
        return session.id


async def test_a_plain_turn_thinks_then_streams_its_answer(
    database: Database, tmp_path: Path, api: FakeAnthropicAPI, llm: AnthropicLLM
) -> None:
    engine = make_engine(database, tmp_path, llm, CompactionPolicy(budget_tokens=50_000))
    session_id = await session_with(database, ["What is due on Friday?"])
    api.script.append(Scripted(text="The quarterly report is due on Friday."))
    progress = RecordedProgress()

    outcome = await engine.reply(await engine.load_context(session_id), progress=progress)

    assert progress.outline() == ["status:thinking", "text"]
    assert progress.shown() == outcome.reply_text == "The quarterly report is due on Friday."
    assert api.requests[-1]["stream"] is True


async def test_a_compacting_turn_says_so_before_the_summary_and_streams_only_the_reply(
    database: Database, tmp_path: Path, api: FakeAnthropicAPI, llm: AnthropicLLM
) -> None:
    policy = CompactionPolicy(budget_tokens=50_000, max_messages=4, keep_last_messages=2)
    engine = make_engine(database, tmp_path, llm, policy)
    session_id = await session_with(
        database, [f"message {n}: I prefer tea over coffee." for n in range(7)]
    )
    progress = RecordedProgress()

    outcome = await engine.reply(await engine.load_context(session_id), progress=progress)

    assert outcome.compacted
    assert progress.outline() == ["status:compacting", "status:thinking", "text"]
    # The summary and fact calls ran between the two statuses, unstreamed.
    summary_calls = [r for r in api.requests if str(r["system"]).startswith("Summarise")]
    assert summary_calls
    assert not any(r.get("stream") for r in summary_calls)
    assert outcome.reply_text == f"{progress.shown()}\n\n{COMPACTION_NOTICE}"


async def test_a_tool_turn_resets_the_text_and_names_each_tool_before_it_runs(
    database: Database, tmp_path: Path, api: FakeAnthropicAPI, llm: AnthropicLLM
) -> None:
    progress = RecordedProgress()
    lookup = ToolLog(progress)
    engine = make_engine(
        database,
        tmp_path,
        llm,
        CompactionPolicy(budget_tokens=50_000),
        tools=(Tool(LOOKUP, lookup.run),),
    )
    session_id = await session_with(database, ["Who owns Acme, and did we talk about it?"])
    api.script.extend(
        [
            Scripted(tool_use={"name": "lookup_account", "input": {"name": "Acme"}}),
            Scripted(tool_use={"name": SEARCH_TOOL_NAME, "input": {"query": "Acme owner"}}),
            Scripted(text="Bob owns Acme; you have not asked before."),
        ]
    )

    outcome = await engine.reply(await engine.load_context(session_id), progress=progress)

    assert progress.outline() == [
        "status:thinking",
        "text",  # "Let me check." before the tool call
        "reset",
        "status:tool:lookup_account",
        "status:thinking",
        "text",
        "reset",
        "status:searching",
        "status:thinking",
        "text",
    ]
    # The lookup ran after its status was shown.
    tool_status = next(
        i for i, call in enumerate(progress.calls) if call.detail == "lookup_account"
    )
    assert lookup.seen_at_run == [tool_status + 1]
    assert progress.shown() == outcome.reply_text == "Bob owns Acme; you have not asked before."
    assert [m.role for m in outcome.messages] == ["assistant", "tool"] * 2 + ["assistant"]


async def test_a_turn_nobody_watches_calls_the_model_without_streaming(
    database: Database, tmp_path: Path, api: FakeAnthropicAPI, llm: AnthropicLLM
) -> None:
    engine = make_engine(database, tmp_path, llm, CompactionPolicy(budget_tokens=50_000))
    session_id = await session_with(database, ["Hello?"])
    outcome = await engine.reply(await engine.load_context(session_id))
    assert outcome.reply_text.startswith("Claude here.")
    assert "stream" not in api.requests[-1]
    assert api.sent == []
