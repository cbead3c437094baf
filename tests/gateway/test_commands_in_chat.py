"""Chat commands over the web channel: each gets one reply, none reaches the model."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from storage.local_transcripts import LocalTranscriptStore
from storage.models import InboundEvent, Session, SessionChannel, SessionMessage
from storage.transcripts import SessionRef, TranscriptLine, parse_transcript
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway

COMMANDS = ("/new", "/sessions", "/resume", "/status", "/forget", "/help")


@pytest.fixture
async def sqlite_gateway(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    config = gateway_config(f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}", tmp_path)
    async with running_gateway(config) as gateway:
        yield gateway


class Chat:
    """One user's side of the conversation: every message waits for its one reply."""

    def __init__(self, gateway: RunningGateway, user: str) -> None:
        self.gateway = gateway
        self.user = user
        self.cursor = ""
        self.count = 0

    async def say(self, text: str, **fields: Any) -> dict[str, Any]:
        self.count += 1
        message_id = f"{self.user}-{self.count}"
        response = await self.gateway.post(self.user, text, message_id=message_id, **fields)
        assert response.status_code == 202, response.text
        async with asyncio.timeout(10):
            while True:
                feed = await self.gateway.replies(self.user, after=self.cursor)
                if feed["messages"]:
                    break
                await asyncio.sleep(0.02)
        (reply,) = feed["messages"]
        self.cursor = feed["cursor"]
        assert reply["in_reply_to"] == message_id, (text, reply)
        return reply

    async def assert_no_more_replies(self) -> None:
        await asyncio.sleep(0.1)
        assert (await self.gateway.replies(self.user, after=self.cursor))["messages"] == []


async def sessions_of(gateway: RunningGateway, user: str) -> dict[str, Session]:
    async with gateway.runtime.database.session() as db:
        rows = (await db.execute(select(Session).where(Session.user_id == user))).scalars()
        return {row.id: row for row in rows}


async def transcript(gateway: RunningGateway, session_id: str) -> list[tuple[str, str]]:
    async with gateway.runtime.database.session() as db:
        rows = await db.execute(
            select(SessionMessage)
            .where(SessionMessage.session_id == session_id)
            .order_by(SessionMessage.seq)
        )
        return [(row.role, row.content) for row in rows.scalars()]


async def count_rows(gateway: RunningGateway, model: Any, session_id: str | None = None) -> int:
    statement = select(func.count()).select_from(model)
    if session_id is not None:
        statement = statement.where(model.session_id == session_id)
    async with gateway.runtime.database.session() as db:
        return int(await db.scalar(statement) or 0)


def session_folder(tmp_path: Path, user: str, session_id: str) -> Path:
    return tmp_path / "transcripts" / "sessions" / "acme" / user / session_id


async def stored_transcript(tmp_path: Path, user: str, session_id: str) -> list[TranscriptLine]:
    """The session's transcript as the gateway's local transcript store holds it."""
    store = LocalTranscriptStore(tmp_path / "transcripts")
    return parse_transcript(await store.read_transcript(SessionRef("acme", user, session_id)))


async def test_help_lists_every_command(sqlite_gateway: RunningGateway) -> None:
    chat = Chat(sqlite_gateway, "alice")
    for command in ("/help", "!help", "  /HELP please"):
        reply = await chat.say(command)
        for name in COMMANDS:
            assert name in reply["text"], (command, name)
        assert reply["session_id"] is None
    await chat.assert_no_more_replies()
    assert await sessions_of(sqlite_gateway, "alice") == {}
    assert await count_rows(sqlite_gateway, SessionMessage) == 0


async def test_an_unknown_command_gets_a_clear_answer_and_never_reaches_the_model(
    sqlite_gateway: RunningGateway,
) -> None:
    chat = Chat(sqlite_gateway, "alice")
    reply = await chat.say("/frobnicate the widgets")
    assert "Unknown command /frobnicate" in reply["text"]
    assert "/help" in reply["text"]
    assert "offline assistant" not in reply["text"]
    await chat.assert_no_more_replies()
    assert await sessions_of(sqlite_gateway, "alice") == {}
    assert await count_rows(sqlite_gateway, SessionMessage) == 0
    async with sqlite_gateway.runtime.database.session() as db:
        (event,) = (await db.execute(select(InboundEvent))).scalars()
    assert event.status == "done"

    first = await chat.say("hello")
    reply = await chat.say("!frobnicate")
    assert "Unknown command /frobnicate" in reply["text"]
    assert await transcript(sqlite_gateway, first["session_id"]) == [
        ("user", "hello"),
        ("assistant", first["text"]),
    ]


async def test_new_archives_the_current_session_and_starts_a_new_one(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(gateway_config(database_url, tmp_path)) as gateway:
        chat = Chat(gateway, "alice")
        first = (await chat.say("hello"))["session_id"]

        created = await chat.say("/new")
        second = created["session_id"]
        assert second not in (None, first)
        assert second[:8] in created["text"]
        assert first[:8] in created["text"]
        assert f"/resume {first[:8]}" in created["text"]
        assert (await chat.say("next topic"))["session_id"] == second

        bang = await chat.say("!new")
        third = bang["session_id"]
        assert third not in (None, first, second)
        assert third[:8] in bang["text"]
        assert second[:8] in bang["text"]
        assert (await chat.say("third topic"))["session_id"] == third
        await chat.assert_no_more_replies()

        sessions = await sessions_of(gateway, "alice")
        transcripts = {sid: await transcript(gateway, sid) for sid in (first, second, third)}
    assert {sid: row.status for sid, row in sessions.items()} == {
        first: "archived",
        second: "archived",
        third: "active",
    }
    assert sessions[first].archived_at is not None
    # The commands are answered by the gateway: not in any transcript, database or file.
    assert [content for _, content in transcripts[first]][::2] == ["hello"]
    assert [content for _, content in transcripts[second]][::2] == ["next topic"]
    assert [content for _, content in transcripts[third]][::2] == ["third topic"]
    for session_id in (first, second, third):
        assert len(transcripts[session_id]) == 2
        lines = await stored_transcript(tmp_path, "alice", session_id)
        assert [line.role for line in lines] == ["user", "assistant"]
        assert not any("new" in line.content for line in lines if line.role == "user")


async def test_sessions_lists_only_the_users_own_sessions_and_marks_the_current_one(
    sqlite_gateway: RunningGateway,
) -> None:
    gateway = sqlite_gateway
    alice, bob = Chat(gateway, "alice"), Chat(gateway, "bob")
    assert "no sessions yet" in (await alice.say("/sessions"))["text"]
    old = (await alice.say("first topic"))["session_id"]
    await alice.say("/new")
    current = (await alice.say("second topic"))["session_id"]
    bobs = (await bob.say("bob's topic"))["session_id"]

    listing = await alice.say("/sessions")
    bob_listing = await bob.say("/sessions")
    await alice.assert_no_more_replies()

    lines = listing["text"].splitlines()
    assert listing["session_id"] == current
    assert [line for line in lines if line.startswith("* ")] == [
        next(line for line in lines if current[:8] in line)
    ]
    (old_line,) = [line for line in lines if old[:8] in line]
    assert old_line.startswith("  ")
    assert "archived" in old_line
    assert "2 msgs" in old_line
    assert bobs[:8] not in listing["text"]
    assert len([line for line in lines if re.match(r"^[* ] [0-9a-f]{8}  ", line)]) == 2
    assert bob_listing["session_id"] == bobs
    assert bobs[:8] in bob_listing["text"]
    assert old[:8] not in bob_listing["text"]
    assert current[:8] not in bob_listing["text"]


async def test_resume_refuses_bad_prefixes_and_continues_the_users_own_session(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(gateway_config(database_url, tmp_path)) as gateway:
        alice, bob = Chat(gateway, "alice"), Chat(gateway, "bob")
        old = (await alice.say("first topic"))["session_id"]
        await alice.say("/new")
        newer = (await alice.say("second topic"))["session_id"]
        bobs = (await bob.say("bob's secret"))["session_id"]

        for command in ("/resume", "/resume abc", f"/resume {old[:3]}"):
            reply = await alice.say(command)
            assert "at least 4 characters" in reply["text"], command
        unknown = await alice.say("/resume zzzz")
        assert "no session starting with 'zzzz'" in unknown["text"]
        for prefix in (bobs, bobs[:8]):
            refused = await alice.say(f"/resume {prefix}")
            assert f"no session starting with '{prefix}'" in refused["text"]
            assert "Resumed" not in refused["text"]
        after_refusals = await alice.say("still here")
        assert after_refusals["session_id"] == newer

        resumed = await alice.say(f"/resume {old[:6].upper()}")
        assert resumed["text"].startswith(f"Resumed session {old[:8]} (2 messages")
        assert resumed["session_id"] == old
        back = await alice.say("back to the first")
        bob_again = await bob.say("bob carries on")
        await alice.assert_no_more_replies()

        sessions = {**await sessions_of(gateway, "alice"), **await sessions_of(gateway, "bob")}
        old_transcript = await transcript(gateway, old)
    assert back["session_id"] == old
    assert "I can see 2 earlier message(s)" in back["text"]
    assert bob_again["session_id"] == bobs
    assert {sid: row.status for sid, row in sessions.items()} == {
        old: "active",
        newer: "archived",
        bobs: "active",
    }
    assert [content for role, content in old_transcript if role == "user"] == [
        "first topic",
        "back to the first",
    ]


async def test_status_shows_id_channels_counts_context_use_and_compactions(
    tmp_path: Path,
) -> None:
    config = gateway_config(
        f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        tmp_path,
        sessions={"history_budget_tokens": 1000},
    )
    async with running_gateway(config) as gateway:
        chat = Chat(gateway, "alice")
        assert "No active session" in (await chat.say("/status"))["text"]
        session_id = (await chat.say("hello"))["session_id"]
        await chat.say("in a thread", thread_id="t-9")
        status = await chat.say("/status")
        await chat.assert_no_more_replies()
        row = (await sessions_of(gateway, "alice"))[session_id]

    text = status["text"]
    assert status["session_id"] == session_id
    assert f"Session {session_id} (active)" in text
    assert "Channels: web:alice, web:alice (thread t-9)" in text
    assert "Messages: 4 (2 from you, 2 from the assistant)" in text
    assert row.context_tokens > 0
    used = row.context_tokens
    assert f"Context use: {used} of 1000 tokens ({100 * used // 1000}%)" in text
    assert "Compactions: 0" in text
    assert row.message_count == 4  # /status itself is not counted


async def test_forget_asks_first_and_confirm_within_five_minutes_deletes_everything(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(gateway_config(database_url, tmp_path)) as gateway:
        alice, bob = Chat(gateway, "alice"), Chat(gateway, "bob")
        assert "no active session" in (await alice.say("/forget"))["text"]
        doomed = (await alice.say("something private"))["session_id"]
        bobs = (await bob.say("bob stays"))["session_id"]

        asked = await alice.say("/forget")
        # Alice's turns run one at a time: the previous one wrote its transcript by now.
        assert await stored_transcript(tmp_path, "alice", doomed)
        assert asked["session_id"] == doomed
        assert f"permanently deletes session {doomed[:8]} and its 2 messages" in asked["text"]
        assert "/forget confirm" in asked["text"]
        assert "5 minutes" in asked["text"]
        assert doomed in await sessions_of(gateway, "alice")  # nothing deleted yet

        gateway.clock.advance(timedelta(minutes=4, seconds=50))
        deleted = await alice.say("/forget confirm")
        assert deleted["text"].startswith(f"Deleted session {doomed[:8]}")
        assert deleted["session_id"] is None
        async with asyncio.timeout(5):
            while session_folder(tmp_path, "alice", doomed).exists():
                await asyncio.sleep(0.02)

        assert await sessions_of(gateway, "alice") == {}
        assert await count_rows(gateway, SessionMessage, doomed) == 0
        assert await count_rows(gateway, SessionChannel, doomed) == 0
        fresh_reply = await alice.say("a fresh start")
        fresh = fresh_reply["session_id"]
        await alice.assert_no_more_replies()
        bob_sessions = await sessions_of(gateway, "bob")
        bob_messages = await count_rows(gateway, SessionMessage, bobs)

    assert fresh not in (None, doomed)
    assert "I can see 0 earlier message(s)" in fresh_reply["text"]
    assert list(bob_sessions) == [bobs]
    assert bob_messages == 2
    assert await stored_transcript(tmp_path, "bob", bobs)


async def test_forget_confirm_after_five_minutes_is_refused(
    sqlite_gateway: RunningGateway, tmp_path: Path
) -> None:
    gateway = sqlite_gateway
    chat = Chat(gateway, "alice")
    kept = (await chat.say("keep me"))["session_id"]
    unasked = await chat.say("/forget confirm")
    assert "Nothing to confirm" in unasked["text"]

    await chat.say("/forget")
    gateway.clock.advance(timedelta(minutes=5, seconds=1))
    late = await chat.say("/forget confirm")
    assert "Nothing to confirm" in late["text"]
    assert "Deleted" not in late["text"]
    after = await chat.say("still there?")
    await chat.assert_no_more_replies()
    sessions = await sessions_of(gateway, "alice")

    assert list(sessions) == [kept]
    assert sessions[kept].status == "active"
    assert sessions[kept].message_count == 4
    assert after["session_id"] == kept
    assert await stored_transcript(tmp_path, "alice", kept)
