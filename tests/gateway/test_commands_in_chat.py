"""Chat commands over the web channel: each gets one reply, none reaches the model."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from structlog.testing import capture_logs

from channels.base import ChannelMessage, ChannelType, Conversation
from channels.registry import channel_plugin
from channels.slack.parse import parse_slack_event, parse_slack_shortcut
from channels.teams.parse import parse_teams_activity
from gateway.commands import (
    EXPORT_ONLY_IN_PRIVATE,
    CommandContext,
    CommandOutcome,
    is_private_conversation,
    parse_command,
    run_command,
)
from gateway.identity import ResolvedUser
from gateway.turns import arrival_of
from sessions.routing import RoutingPolicy
from storage.database import Database
from storage.local_transcripts import LocalTranscriptStore
from storage.models import ExportLink, InboundEvent, Session, SessionChannel, SessionMessage
from storage.repositories.sessions import SessionRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from storage.transcripts import SessionRef, TranscriptLine, parse_transcript
from tests.channels.test_teams_parse import APP_ID as TEAMS_APP_ID
from tests.channels.test_teams_parse import CHANNEL as TEAMS_CHANNEL
from tests.channels.test_teams_parse import TENANT as TEAMS_TENANT
from tests.channels.test_teams_parse import activity as teams_activity
from tests.channels.test_teams_parse import mention as teams_mention
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway
from tests.fakes.slack_api import BOT_USER, TEAM, direct_message, event_envelope

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


# --- where a command is asked: exports only in private, no DM details in shared places ------

ALICE = ResolvedUser("alice", "acme", "Alice")
POLICY = RoutingPolicy(scope="user", archive_after=timedelta(hours=8))
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
DM_SECRET = "the vault code is PLUM-4471"


def slack_message(event: dict[str, Any]) -> ChannelMessage:
    message = parse_slack_event(event_envelope(event, "EvCmd"))
    assert message is not None
    return message


def slack_dm(text: str) -> ChannelMessage:
    return slack_message(direct_message(text, ts="1700000000.000100"))


def slack_mention(text: str, channel: str = "C0001") -> ChannelMessage:
    ts = "1700000001.000100"
    return slack_message(
        {"type": "app_mention", "channel": channel, "user": "U0001", "ts": ts, "event_ts": ts}
        | {"text": f"<@{BOT_USER}> {text}"}
    )


def slack_thread_reply(text: str, channel: str = "C0001", kind: str = "channel") -> ChannelMessage:
    return slack_message(
        {
            "type": "message",
            "channel": channel,
            "channel_type": kind,
            "user": "U0001",
            "text": text,
            "ts": "1700000002.000100",
            "thread_ts": "1700000001.000100",
        }
    )


def slack_shortcut() -> ChannelMessage:
    return parse_slack_shortcut(
        {
            "type": "message_action",
            "callback_id": "send_to_assistant",
            "trigger_id": "1.2.3",
            "action_ts": "1700000003.000100",
            "team": {"id": TEAM, "domain": "acme"},
            "user": {"id": "U0001", "team_id": TEAM},
            "channel": {"id": "C0002", "name": "deals"},
            "message": {"type": "message", "user": "U0009", "text": "hi", "ts": "1700000002.1"},
        }
    )


def teams_message(text: str, conversation: dict[str, Any]) -> ChannelMessage:
    mentioned = conversation["conversationType"] != "personal"
    activity = teams_activity(
        conversation={**conversation, "tenantId": TEAMS_TENANT},
        text=f"<at>Assistant</at> {text}" if mentioned else text,
        entities=[teams_mention()] if mentioned else [],
    )
    message = parse_teams_activity(activity, bot_id=TEAMS_APP_ID)
    assert message is not None
    return message


def teams_personal(text: str) -> ChannelMessage:
    return teams_message(text, {"id": "a:1chat", "conversationType": "personal"})


def teams_channel(text: str) -> ChannelMessage:
    conversation_id = f"{TEAMS_CHANNEL};messageid=1717243100000"
    return teams_message(
        text, {"id": conversation_id, "conversationType": "channel", "isGroup": True}
    )


def teams_group_chat(text: str) -> ChannelMessage:
    return teams_message(
        text, {"id": "19:group@thread.v2", "conversationType": "groupChat", "isGroup": True}
    )


def email_message(text: str) -> ChannelMessage:
    return ChannelMessage(
        channel_type=ChannelType.EMAIL,
        channel_id="assistant@acme.example",
        message_id="<m1@acme.example>",
        user_identifier="alice@acme.example",
        content="",
        timestamp=NOW,
        thread_id="<m1@acme.example>",
        reply_context={"subject": text, "reply_to": "alice@acme.example"},
        conversation=Conversation.DIRECT,
        subject=text,
    )


def web_message(text: str) -> ChannelMessage:
    return ChannelMessage(
        channel_type=ChannelType.WEB,
        channel_id="alice",
        message_id="alice:m1",
        user_identifier="alice",
        content=text,
        timestamp=NOW,
        reply_context={"client_message_id": "m1"},
        conversation=Conversation.DIRECT,
    )


PRIVATE_PLACES = {
    "a Slack DM": slack_dm,
    "a Teams personal chat": teams_personal,
    "email": email_message,
    "the web": web_message,
}
SHARED_PLACES = {
    "a Slack channel mention": slack_mention,
    "a Slack channel thread": slack_thread_reply,
    "a Slack private channel": lambda text: slack_thread_reply(text, "G0001", "group"),
    "a Slack group DM": lambda text: slack_thread_reply(text, "C0003", "mpim"),
    "a Teams channel": teams_channel,
    "a Teams group chat": teams_group_chat,
}


@pytest.mark.parametrize("place", PRIVATE_PLACES)
def test_dms_personal_chats_email_and_the_web_are_private(place: str) -> None:
    assert is_private_conversation(PRIVATE_PLACES[place]("/export"))


def test_the_dm_a_slack_shortcut_is_answered_in_is_private() -> None:
    message = slack_shortcut()
    assert message.channel_id == "U0001"  # Slack delivers a post to a user id to the app's DM
    assert is_private_conversation(message)


@pytest.mark.parametrize("place", SHARED_PLACES)
def test_channels_group_chats_and_group_dms_are_shared(place: str) -> None:
    assert not is_private_conversation(SHARED_PLACES[place]("/export"))


def test_a_conversation_not_known_to_be_private_counts_as_shared() -> None:
    unmarked = teams_message("/export", {"id": "a:1chat", "conversationType": ""})
    assert unmarked.conversation is not Conversation.DIRECT
    assert not is_private_conversation(unmarked)
    # A message built without saying where it came from (or stored before the field existed).
    assert not is_private_conversation(
        replace(slack_dm("/export"), conversation=Conversation.CHANNEL)
    )
    record = slack_dm("/export").to_record()
    del record["conversation"]
    assert not is_private_conversation(ChannelMessage.from_record(record))


@pytest.fixture
async def alices_database(tmp_path: Path) -> AsyncIterator[Database]:
    """A database where Alice's one session holds a DM and a thread in channel C0001."""
    database = Database(f"sqlite+aiosqlite:///{tmp_path / 'commands.db'}")
    await database.upgrade()
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("alice", "acme", "Alice")
        sessions = SessionRepository(db)
        session = await sessions.create("alice", "acme", at=NOW)
        session.topic_summary = DM_SECRET
        await sessions.record_channel(session.id, "slack", "D0001", "", at=NOW)
        await sessions.record_channel(session.id, "slack", "C0001", "1700000001.000100", at=NOW)
        await sessions.append_message(
            session.id, role="user", channel_type="slack", content=DM_SECRET, at=NOW
        )
    yield database
    await database.dispose()


async def run_as_alice(
    database: Database, message: ChannelMessage, tmp_path: Path
) -> tuple[CommandOutcome, list[ExportLink]]:
    """Run the message's command for Alice; the reply and the export links that exist after."""
    command = parse_command(message)
    assert command is not None
    async with database.session() as db:
        outcome = await run_command(
            command,
            CommandContext(
                db=db,
                user=ALICE,
                arrival=arrival_of(message, ALICE),
                message=message,
                policy=POLICY,
                history_budget_tokens=1000,
                now=NOW,
                transcripts=LocalTranscriptStore(tmp_path / "transcripts"),
                public_url="https://gateway.example",
            ),
        )
    async with database.session() as db:
        links = list((await db.execute(select(ExportLink))).scalars())
    return outcome, links


@pytest.mark.parametrize("place", SHARED_PLACES)
@pytest.mark.parametrize("command", ["/export", "/export {session_id}"])
async def test_an_export_asked_for_in_a_shared_conversation_is_refused_and_nothing_is_made(
    alices_database: Database, tmp_path: Path, place: str, command: str
) -> None:
    async with alices_database.session() as db:
        (session,) = (await db.execute(select(Session))).scalars()
    message = SHARED_PLACES[place](command.format(session_id=session.id[:8]))
    with capture_logs() as logged:
        outcome, links = await run_as_alice(alices_database, message, tmp_path)

    assert outcome == CommandOutcome(EXPORT_ONLY_IN_PRIVATE)
    assert "only send them in a direct message" in outcome.reply
    assert "/web/v1/exports/" not in outcome.reply
    assert links == []
    (refusal,) = [line for line in logged if line["event"] == "export.refused"]
    assert refusal["reason"] == "shared conversation"
    assert refusal["user_id"] == "alice"
    assert refusal["channel_id"] == message.channel_id


@pytest.mark.parametrize("place", PRIVATE_PLACES)
async def test_an_export_asked_for_in_a_private_conversation_is_made(
    alices_database: Database, tmp_path: Path, place: str
) -> None:
    message = PRIVATE_PLACES[place]("/export")
    outcome, links = await run_as_alice(alices_database, message, tmp_path)

    (link,) = links
    assert link.user_id == "alice"
    assert outcome.session_id == link.session_id
    assert "https://gateway.example/web/v1/exports/" in outcome.reply
    if channel_plugin(message.channel_type).delivers_files:
        assert outcome.file is not None
        assert DM_SECRET in outcome.file.content
    else:
        assert outcome.file is None


@pytest.mark.parametrize("place", SHARED_PLACES)
async def test_sessions_and_status_in_a_shared_conversation_leave_out_topics_and_channels(
    alices_database: Database, tmp_path: Path, place: str
) -> None:
    listing, _ = await run_as_alice(alices_database, SHARED_PLACES[place]("/sessions"), tmp_path)
    status, _ = await run_as_alice(alices_database, SHARED_PLACES[place]("/status"), tmp_path)

    assert "PLUM-4471" not in listing.reply
    assert "Topics are shown only in a direct message." in listing.reply
    assert re.search(r"^\* [0-9a-f]{8}  .*  active  +1 msgs$", listing.reply, re.M)
    assert "D0001" not in status.reply
    assert "Channels: 2 (listed only in a direct message)" in status.reply
    assert "Messages: 1 (1 from you, 0 from the assistant)" in status.reply


async def test_sessions_and_status_in_a_dm_show_topics_and_channels(
    alices_database: Database, tmp_path: Path
) -> None:
    listing, _ = await run_as_alice(alices_database, slack_dm("/sessions"), tmp_path)
    status, _ = await run_as_alice(alices_database, slack_dm("/status"), tmp_path)

    assert DM_SECRET in listing.reply
    assert "Topics are shown only" not in listing.reply
    assert "Channels: slack:D0001, slack:C0001 (thread 1700000001.000100)" in status.reply
