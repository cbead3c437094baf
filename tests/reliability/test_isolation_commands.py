"""Isolation between users: Alice never reads, resumes, exports or deletes Bob's session.

Alice tries through every door a whole gateway has on loopback sockets: the web API with her
own bearer token, chat commands on the web, Slack (signed events, a fake Slack Web API) and
email (real SMTP), `/export` download links, the admin API without the admin token, and the
model's context (a fake Anthropic API records what each turn sent). Bob's words carry a
secret, so a leak anywhere shows up as that secret in something Alice got; Bob's rows are
compared before and after, so a change to his session shows up too.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from gateway.settings import GatewayConfig
from sessions.recall_tool import SEARCH_TOOL_NAME
from storage.local_transcripts import LocalTranscriptStore
from storage.models import (
    ExportLink,
    InboundEvent,
    OutboundMessage,
    Session,
    SessionChannel,
    SessionMessage,
    User,
)
from storage.transcripts import SessionRef
from tests.channels.email_mail import deliver
from tests.e2e.harness import RunningGateway, free_port, gateway_config, running_gateway
from tests.fakes.anthropic_api import FakeAnthropicAPI, Scripted
from tests.fakes.slack_api import (
    BOT_USER,
    SIGNING_SECRET,
    TEAM,
    FakeSlackAPI,
    direct_message,
    event_envelope,
    send_event,
)
from tests.fakes.smtp_sink import Delivery, SmtpSink

ALICE_TOKEN = "alice-web-token-5b1e7c"
BOB_TOKEN = "bob-web-token-93d0a2"
ADMIN_TOKEN = "admin-token-1f4c88"
VAULT_CODE = "PLUM-4471"
BOB_WORDS = f"Remember that the vault code is {VAULT_CODE}."
ALICE_CODE = "LOCKER-2290"
ALICE_WORDS = f"Remember that my locker code is {ALICE_CODE}."
ALICE_EMAIL = "alice@acme.example"
BOB_EMAIL = "bob@acme.example"
ASSISTANT = "assistant@acme.example"


def isolation_config(
    database_url: str,
    tmp_path: Path,
    *,
    channels: dict[str, Any] | None = None,
    admin_token: str | None = ADMIN_TOKEN,
    **sections: Any,
) -> GatewayConfig:
    """Alice and Bob (each also on Slack and email); the web API open only to their tokens."""
    web = {
        "dev_open": False,
        "tokens": [{"token": ALICE_TOKEN, "user": "alice"}, {"token": BOB_TOKEN, "user": "bob"}],
    }
    users = [
        {
            "id": "alice",
            "org": "acme",
            "name": "Alice",
            "slack": [f"{TEAM}:U0001"],
            "email": [ALICE_EMAIL],
        },
        {
            "id": "bob",
            "org": "acme",
            "name": "Bob",
            "slack": [f"{TEAM}:U0002"],
            "email": [BOB_EMAIL],
        },
    ]
    if admin_token is not None:
        sections["admin"] = {"token": admin_token}
    return gateway_config(
        database_url,
        tmp_path,
        identity={"users": users},
        channels={"web": web, **(channels or {})},
        **sections,
    )


class WebUser:
    """One user of the web API with their own bearer token; each message waits for its reply."""

    def __init__(self, gateway: RunningGateway, name: str, token: str) -> None:
        self.client = gateway.client
        self.name = name
        self.headers = {"Authorization": f"Bearer {token}"}
        self.cursor = ""
        self.sent = 0

    async def say(self, text: str) -> dict[str, Any]:
        """Post `text` and return the one reply to it."""
        self.sent += 1
        message_id = f"{self.name}-{self.sent}"
        response = await self.client.post(
            "/web/v1/messages",
            json={"text": text, "message_id": message_id},
            headers=self.headers,
        )
        assert response.status_code == 202, response.text
        async with asyncio.timeout(10):
            while not (page := await self.page(self.cursor))["messages"]:
                await asyncio.sleep(0.02)
        reply: dict[str, Any]
        (reply,) = page["messages"]
        self.cursor = page["cursor"]
        assert reply["in_reply_to"] == message_id, (text, reply)
        return reply

    async def page(self, after: str = "") -> dict[str, Any]:
        """One page of the user's reply feed."""
        response = await self.client.get(
            "/web/v1/messages", params={"after": after}, headers=self.headers
        )
        assert response.status_code == 200, response.text
        page: dict[str, Any] = response.json()
        return page

    async def feed(self) -> list[dict[str, Any]]:
        """Every reply the user's feed holds, all pages."""
        messages: list[dict[str, Any]] = []
        cursor = ""
        while (page := await self.page(cursor))["messages"]:
            messages.extend(page["messages"])
            cursor = page["cursor"]
        return messages


SLACK_EVENT_NUMBERS = itertools.count(1)


async def slack_posts(api: FakeSlackAPI, channel: str, count: int) -> list[dict[str, Any]]:
    """The posts in `channel`, once there are at least `count`."""
    async with asyncio.timeout(10):
        while len(api.posts(channel)) < count:
            await asyncio.sleep(0.02)
    return api.posts(channel)


class SlackUser:
    """One Slack user sending signed events; each message waits for its reply's post."""

    def __init__(self, gateway: RunningGateway, api: FakeSlackAPI, user: str, dm: str) -> None:
        self.gateway = gateway
        self.api = api
        self.user = user
        self.dm = dm

    async def say(
        self, text: str, *, channel: str | None = None, thread_ts: str | None = None
    ) -> dict[str, Any]:
        """Send `text` in the user's DM, or in `channel` (a mention when no `thread_ts` is
        given, else a reply in that thread); the reply's post."""
        number = next(SLACK_EVENT_NUMBERS)
        ts = f"1700{number:06d}.000100"
        if channel is None:
            event = direct_message(text, user=self.user, ts=ts, channel=self.dm)
        elif thread_ts is None:
            event = {
                "type": "app_mention",
                "channel": channel,
                "user": self.user,
                "text": f"<@{BOT_USER}> {text}",
                "ts": ts,
                "event_ts": ts,
            }
        else:
            event = {
                "type": "message",
                "channel": channel,
                "channel_type": "channel",
                "user": self.user,
                "text": text,
                "ts": ts,
                "thread_ts": thread_ts,
            }
        where = channel or self.dm
        before = len(self.api.posts(where))
        answer = await send_event(self.gateway.client, event_envelope(event, f"EvIso{number}"))
        assert answer.status_code == 200, answer.text
        return (await slack_posts(self.api, where, before + 1))[before]


async def session_state(gateway: RunningGateway, user_id: str) -> dict[str, dict[str, Any]]:
    """What another user must never change of `user_id`'s sessions: status, counters, when
    they were active and current, their channels and their messages."""
    state: dict[str, dict[str, Any]] = {}
    async with gateway.runtime.database.session() as db:
        sessions = await db.execute(
            select(Session).where(Session.user_id == user_id).order_by(Session.created_at)
        )
        for session in sessions.scalars():
            channels = await db.execute(
                select(SessionChannel.channel_type, SessionChannel.channel_id)
                .where(SessionChannel.session_id == session.id)
                .order_by(SessionChannel.id)
            )
            messages = await db.execute(
                select(SessionMessage.role, SessionMessage.content)
                .where(SessionMessage.session_id == session.id)
                .order_by(SessionMessage.seq)
            )
            state[session.id] = {
                "status": session.status,
                "message_count": session.message_count,
                "last_active_at": session.last_active_at,
                "current_since": session.current_since,
                "forget_requested_at": session.forget_requested_at,
                "channels": [tuple(row) for row in channels],
                "messages": [tuple(row) for row in messages],
            }
    return state


async def count_rows(gateway: RunningGateway, model: Any) -> int:
    async with gateway.runtime.database.session() as db:
        return int(await db.scalar(select(func.count()).select_from(model)) or 0)


async def stored_transcript(tmp_path: Path, user: str, session_id: str) -> bytes:
    """The session's transcript as the gateway's local transcript store holds it."""
    store = LocalTranscriptStore(tmp_path / "transcripts")
    return await store.read_transcript(SessionRef("acme", user, session_id))


def assert_nothing_of_bob(text: str, bob_sessions: list[str], *, echoed: str = "") -> None:
    """Neither Bob's secret nor any part of his session ids, apart from the `echoed` argument
    of Alice's own command (a refusal may quote what she typed)."""
    if echoed:
        text = text.replace(echoed, "<what Alice typed>")
    assert VAULT_CODE not in text
    for session_id in bob_sessions:
        assert session_id[:8] not in text
        assert session_id[-8:] not in text


# --- the web API ---------------------------------------------------------------------------


async def test_a_web_token_reads_and_writes_only_its_own_users_messages(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(isolation_config(database_url, tmp_path)) as gateway:
        alice, bob = WebUser(gateway, "alice", ALICE_TOKEN), WebUser(gateway, "bob", BOB_TOKEN)
        bobs = (await bob.say(BOB_WORDS))["session_id"]
        alices = (await alice.say(ALICE_WORDS))["session_id"]
        before = await session_state(gateway, "bob")
        events_before = await count_rows(gateway, InboundEvent)

        client = gateway.client
        as_alice = {"Authorization": f"Bearer {ALICE_TOKEN}"}
        read_bob = await client.get("/web/v1/messages", params={"user": "bob"}, headers=as_alice)
        post_as_bob = await client.post(
            "/web/v1/messages", json={"user": "bob", "text": "I am Bob now"}, headers=as_alice
        )
        refused: dict[str, httpx.Response] = {
            "no token": await client.get("/web/v1/messages", params={"user": "bob"}),
            "no token, posting": await client.post(
                "/web/v1/messages", json={"user": "bob", "text": "I am Bob now"}
            ),
            "unknown token": await client.get(
                "/web/v1/messages", headers={"Authorization": "Bearer not-a-token"}
            ),
            "Bob's token cut short": await client.get(
                "/web/v1/messages", headers={"Authorization": f"Bearer {BOB_TOKEN[:-1]}"}
            ),
            "Bob's token, another scheme": await client.get(
                "/web/v1/messages", headers={"Authorization": f"Basic {BOB_TOKEN}"}
            ),
        }
        await asyncio.sleep(0.2)  # a message accepted by mistake would be answered by now
        alice_feed = await alice.feed()
        bob_feed = await bob.feed()
        after = await session_state(gateway, "bob")
        events_after = await count_rows(gateway, InboundEvent)

    for response in (read_bob, post_as_bob):
        assert (response.status_code, response.json()) == (
            403,
            {"error": "the token belongs to another user"},
        )
    for name, response in refused.items():
        assert response.status_code == 401, name
        assert response.json()["error"], name
    assert refused["no token"].json() == {"error": "missing bearer token"}
    assert refused["unknown token"].json() == {"error": "unknown token"}
    assert [reply["session_id"] for reply in alice_feed] == [alices]
    assert_nothing_of_bob(json.dumps(alice_feed), [bobs])
    assert VAULT_CODE in bob_feed[0]["text"]  # the secret is in Bob's own feed
    assert after == before
    assert events_after == events_before


# --- chat commands ------------------------------------------------------------------------


async def test_alices_commands_on_the_web_never_reach_bobs_sessions(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(isolation_config(database_url, tmp_path)) as gateway:
        alice, bob = WebUser(gateway, "alice", ALICE_TOKEN), WebUser(gateway, "bob", BOB_TOKEN)
        bobs_archived = (await bob.say(BOB_WORDS))["session_id"]
        bobs_current = (await bob.say("/new"))["session_id"]
        await bob.say("Something else entirely.")
        alices = (await alice.say(ALICE_WORDS))["session_id"]
        before = await session_state(gateway, "bob")

        replies = {}
        for target in (bobs_archived, bobs_current):
            for given in (target, target[:8]):
                replies[f"/resume {given}"] = await alice.say(f"/resume {given}")
                replies[f"/export {given}"] = await alice.say(f"/export {given}")
        replies["/status"] = await alice.say("/status")
        replies["/sessions"] = await alice.say("/sessions")
        replies["/forget"] = await alice.say("/forget")
        replies["/forget confirm"] = await alice.say("/forget confirm")
        after = await session_state(gateway, "bob")
        bob_again = await bob.say("Are you still there?")
        alice_sessions = await session_state(gateway, "alice")

    for command, reply in replies.items():
        echoed = command.partition(" ")[2]
        assert_nothing_of_bob(reply["text"], [bobs_archived, bobs_current], echoed=echoed)
        assert "/web/v1/exports/" not in reply["text"], command
        assert reply["session_id"] in (alices, None), command
        if command.startswith("/resume"):
            assert "You have no session starting with" in reply["text"], command
        if command.startswith("/export"):
            assert "does not name exactly one of your sessions" in reply["text"], command
    assert f"Session {alices} (active)" in replies["/status"]["text"]
    assert alices[:8] in replies["/sessions"]["text"]
    assert replies["/forget confirm"]["text"].startswith(f"Deleted session {alices[:8]}")
    assert alice_sessions == {}
    # Bob's sessions are exactly as they were; his next message continues his current one.
    assert after == before
    assert [state["status"] for state in after.values()] == ["archived", "active"]
    assert after[bobs_archived]["messages"][0] == ("user", BOB_WORDS)
    assert bob_again["session_id"] == bobs_current
    assert "I can see 2 earlier message(s)" in bob_again["text"]
    assert BOB_WORDS in (await stored_transcript(tmp_path, "bob", bobs_archived)).decode()


@pytest.fixture
def slack_api() -> Iterator[FakeSlackAPI]:
    with FakeSlackAPI() as api:
        yield api


def slack_channel(api: FakeSlackAPI) -> dict[str, Any]:
    return {
        "slack": {
            "enabled": True,
            "bot_token": "xoxb-test",
            "signing_secret": SIGNING_SECRET,
            "api_base_url": api.url,
        }
    }


async def test_alices_commands_on_slack_never_reach_bobs_session(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    config = isolation_config(database_url, tmp_path, channels=slack_channel(slack_api))
    async with running_gateway(config) as gateway:
        alice = SlackUser(gateway, slack_api, "U0001", dm="D0001")
        bob = SlackUser(gateway, slack_api, "U0002", dm="D0002")
        await bob.say(BOB_WORDS)
        await alice.say(ALICE_WORDS)
        before = await session_state(gateway, "bob")
        (bobs,) = before
        (alices,) = await session_state(gateway, "alice")

        replies = {}
        for given in (bobs, bobs[:8]):
            replies[f"/resume {given}"] = await alice.say(f"/resume {given}")
            replies[f"/export {given}"] = await alice.say(f"/export {given}")
        replies["/status"] = await alice.say("/status")
        replies["/sessions"] = await alice.say("/sessions")
        await alice.say("/forget")
        replies["/forget confirm"] = await alice.say("/forget confirm")
        await asyncio.sleep(0.2)  # a surplus post would show up now
        after = await session_state(gateway, "bob")

    for command, reply in replies.items():
        assert_nothing_of_bob(reply["text"], [bobs], echoed=command.partition(" ")[2])
        if command.startswith("/resume"):
            assert "You have no session starting with" in reply["text"], command
        if command.startswith("/export"):
            assert "does not name exactly one of your sessions" in reply["text"], command
    assert f"Session {alices} (active)" in replies["/status"]["text"]
    assert alices[:8] in replies["/sessions"]["text"]
    assert replies["/forget confirm"]["text"].startswith(f"Deleted session {alices[:8]}")
    assert slack_api.uploads == {}  # no export was made, so no file went anywhere
    assert len(slack_api.posts("D0001")) == 9  # one reply to each of her nine messages
    assert len(slack_api.posts("D0002")) == 1  # Bob's one reply: nothing of Alice's went to him
    assert after == before
    assert after[bobs]["channels"] == [("slack", "D0002")]


async def test_alice_speaking_in_bobs_slack_thread_neither_joins_nor_changes_his_session(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    config = isolation_config(database_url, tmp_path, channels=slack_channel(slack_api))
    async with running_gateway(config) as gateway:
        alice = SlackUser(gateway, slack_api, "U0001", dm="D0001")
        bob = SlackUser(gateway, slack_api, "U0002", dm="D0002")
        thread = (await bob.say(BOB_WORDS, channel="C0001"))["thread_ts"]
        before = await session_state(gateway, "bob")
        (bobs,) = before

        status = await alice.say("/status", channel="C0001", thread_ts=thread)
        asked = await alice.say("What did Bob tell you?", channel="C0001", thread_ts=thread)
        after_alice = await session_state(gateway, "bob")
        alice_sessions = await session_state(gateway, "alice")
        bob_again = await bob.say("Still my thread?", channel="C0001", thread_ts=thread)
        after_bob = await session_state(gateway, "bob")

    assert "No active session" in status["text"]
    # Alice is answered in the thread, from a session of her own.
    assert "What did Bob tell you?" in asked["text"]
    (alices,) = alice_sessions.values()
    assert alices["messages"][0] == ("user", "What did Bob tell you?")
    for reply in (status, asked):
        assert reply["thread_ts"] == thread
        assert_nothing_of_bob(reply["text"], [bobs])
    assert after_alice == before
    assert all(VAULT_CODE not in str(state) for state in alice_sessions.values())
    # Bob's thread still leads to his session, which saw only his own messages.
    assert "Still my thread?" in bob_again["text"]
    assert [content for role, content in after_bob[bobs]["messages"] if role == "user"] == [
        BOB_WORDS,
        "Still my thread?",
    ]


async def test_an_export_asked_for_in_a_shared_channel_shows_others_nothing_of_the_dms(
    tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    config = isolation_config(url, tmp_path, channels=slack_channel(slack_api))
    async with running_gateway(config) as gateway:
        bob = SlackUser(gateway, slack_api, "U0002", dm="D0002")
        await bob.say(BOB_WORDS)  # in his DM: private
        thread = (await bob.say("Hello team", channel="C0001"))["thread_ts"]
        await bob.say("/export", channel="C0001", thread_ts=thread)
        async with gateway.runtime.database.session() as db:
            posted = await db.scalar(
                select(OutboundMessage.content).where(OutboundMessage.kind == "command")
            )
        # What Alice, another member of C0001, can open: the link posted in the channel.
        download = await gateway.client.get(str(posted).rsplit(" ", 1)[1])
    in_channel = [upload for upload in slack_api.uploads.values() if upload["channel"] == "C0001"]
    assert all(VAULT_CODE not in str(upload["content"]) for upload in in_channel)
    assert download.status_code != 200 or VAULT_CODE not in download.text


# --- email -------------------------------------------------------------------------------


@pytest.fixture
async def sink() -> AsyncIterator[SmtpSink]:
    server = SmtpSink()
    await server.start()
    yield server
    await server.stop()


def email(sender: str, subject: str, body: str, message_id: str, **headers: str) -> bytes:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = ASSISTANT
    message["Subject"] = subject
    message["Message-ID"] = message_id
    for name, value in headers.items():
        message[name.replace("_", "-")] = value
    message.set_content(body)
    return message.as_bytes()


def delivered_to(sink: SmtpSink, address: str) -> list[Delivery]:
    return [delivery for delivery in sink.deliveries if delivery.rcpt_tos == [address]]


def plain_text(message: EmailMessage) -> str:
    body = message.get_body(("plain",))
    assert body is not None
    return str(body.get_content())


async def test_alices_mail_never_reaches_bobs_session_even_as_an_answer_to_his_reply(
    database_url: str, tmp_path: Path, sink: SmtpSink
) -> None:
    port = free_port()
    channels = {
        "email": {
            "enabled": True,
            "listen_port": port,
            "addresses": [ASSISTANT],
            "auth": {"mode": "off"},  # DNS is out of reach; the channel's own tests cover it
            "outbound": {"host": "127.0.0.1", "port": sink.port},
        }
    }
    async with running_gateway(isolation_config(database_url, tmp_path, channels=channels)) as gw:
        await deliver(
            port,
            email(BOB_EMAIL, "Vault", BOB_WORDS, "<bob-1@acme.example>"),
            mail_from=BOB_EMAIL,
        )
        (to_bob,) = await sink.wait_for(1, timeout=10)
        before = await session_state(gw, "bob")
        (bobs,) = before
        # Bob forwarded the assistant's reply to Alice; she answers it, threading and all.
        reply_id = to_bob.message["Message-ID"]
        answer = email(
            ALICE_EMAIL,
            "Re: Vault",
            "What else did Bob say?",
            "<alice-1@acme.example>",
            In_Reply_To=reply_id,
            References=f"<bob-1@acme.example> {reply_id}",
        )
        await deliver(port, answer, mail_from=ALICE_EMAIL)
        await sink.wait_for(2, timeout=10)
        for number, subject in enumerate((f"/resume {bobs[:8]}", f"/export {bobs}"), start=2):
            command = email(ALICE_EMAIL, subject, "", f"<alice-{number}@acme.example>")
            await deliver(port, command, mail_from=ALICE_EMAIL)
        await sink.wait_for(4, timeout=10)
        await asyncio.sleep(0.2)  # a surplus mail would arrive now
        after = await session_state(gw, "bob")

    to_alice = [delivery.message for delivery in delivered_to(sink, ALICE_EMAIL)]
    texts = [plain_text(message) for message in to_alice]
    assert len(to_alice) == 3
    assert "What else did Bob say?" in texts[0]  # answered, from a session of her own
    assert len(delivered_to(sink, BOB_EMAIL)) == 1
    for message, text, echoed in zip(to_alice, texts, ("", bobs[:8], bobs), strict=True):
        assert_nothing_of_bob(text, [bobs], echoed=echoed)
        assert not list(message.iter_attachments())
    assert "You have no session starting with" in texts[1]
    assert "does not name exactly one of your sessions" in texts[2]
    assert after == before


# --- export links --------------------------------------------------------------------------


async def test_an_export_link_yields_only_its_makers_session_and_guesses_get_404(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(isolation_config(database_url, tmp_path)) as gateway:
        alice, bob = WebUser(gateway, "alice", ALICE_TOKEN), WebUser(gateway, "bob", BOB_TOKEN)
        bobs = (await bob.say(BOB_WORDS))["session_id"]
        bob_link = (await bob.say("/export"))["text"].rsplit(" ", 1)[1]
        alices = (await alice.say(ALICE_WORDS))["session_id"]
        alice_link = (await alice.say("/export"))["text"].rsplit(" ", 1)[1]
        async with gateway.runtime.database.session() as db:
            stored_hashes = list((await db.execute(select(ExportLink.token_hash))).scalars())

        client = gateway.client
        alices_export = await client.get(alice_link)
        bobs_export = await client.get(bob_link)
        token = alice_link.rsplit("/", 1)[1]
        altered = token[:-1] + ("A" if token[-1] != "A" else "B")
        guesses = [
            secrets.token_urlsafe(32),
            altered,
            token[:-1],
            *stored_hashes,  # what a copy of the database would give away
        ]
        guessed = [await client.get(f"/web/v1/exports/{guess}") for guess in guesses]
        with_bobs_token = await client.get(
            f"/web/v1/exports/{altered}", headers={"Authorization": f"Bearer {BOB_TOKEN}"}
        )
        await alice.say("/forget")
        await alice.say("/forget confirm")
        after_forget = await client.get(alice_link)
        bobs_after = await client.get(bob_link)

    assert alices_export.status_code == 200
    data = alices_export.json()
    assert (data["session_id"], data["user_id"]) == (alices, "alice")
    assert data["messages"][0]["content"] == ALICE_WORDS
    assert_nothing_of_bob(alices_export.text, [bobs])
    assert VAULT_CODE in bobs_export.text  # the secret is in Bob's own export
    assert len(stored_hashes) == 2
    for response in [*guessed, with_bobs_token, after_forget]:
        assert response.status_code == 404
        assert response.json() == {"error": "unknown or expired export link"}
    assert bobs_after.status_code == 200
    assert bobs_after.json()["session_id"] == bobs


# --- the admin API -------------------------------------------------------------------------


def admin_routes(session_id: str, user_id: str) -> list[tuple[str, str]]:
    """Every route of the admin API, aimed at one session and one user."""
    return [
        ("GET", "/admin/v1/sessions"),
        ("GET", f"/admin/v1/sessions?user={user_id}"),
        ("GET", f"/admin/v1/sessions/{session_id}"),
        ("GET", f"/admin/v1/sessions/{session_id}/export"),
        ("POST", f"/admin/v1/sessions/{session_id}/archive"),
        ("DELETE", f"/admin/v1/sessions/{session_id}"),
        ("GET", "/admin/v1/users"),
        ("GET", f"/admin/v1/users/{user_id}"),
        ("GET", f"/admin/v1/users/{user_id}/export"),
        ("DELETE", f"/admin/v1/users/{user_id}"),
    ]


WRONG_ADMIN_CREDENTIALS = {
    "no header": None,
    "a wrong token": "Bearer not-the-admin-token",
    "Alice's web token": f"Bearer {ALICE_TOKEN}",
    "Bob's web token": f"Bearer {BOB_TOKEN}",
    "the admin token cut short": f"Bearer {ADMIN_TOKEN[:-1]}",
    "the admin token with more": f"Bearer {ADMIN_TOKEN}0",
    "the admin token, another scheme": f"Basic {ADMIN_TOKEN}",
}


async def everyones_state(gateway: RunningGateway) -> dict[str, Any]:
    """The users, and the state of Alice's and Bob's sessions."""
    async with gateway.runtime.database.session() as db:
        users = sorted((await db.execute(select(User.id))).scalars())
    return {
        "users": users,
        "alice": await session_state(gateway, "alice"),
        "bob": await session_state(gateway, "bob"),
    }


async def test_every_admin_route_refuses_requests_without_the_admin_token(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(isolation_config(database_url, tmp_path)) as gateway:
        alice, bob = WebUser(gateway, "alice", ALICE_TOKEN), WebUser(gateway, "bob", BOB_TOKEN)
        bobs = (await bob.say(BOB_WORDS))["session_id"]
        await alice.say(ALICE_WORDS)
        before = await everyones_state(gateway)

        answers = {}
        for method, path in admin_routes(bobs, "bob"):
            for name, header in WRONG_ADMIN_CREDENTIALS.items():
                headers = {"Authorization": header} if header else {}
                answers[method, path, name] = await gateway.client.request(
                    method, path, headers=headers
                )
        after = await everyones_state(gateway)
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        shown = await gateway.client.get(f"/admin/v1/sessions/{bobs}", headers=admin)

    assert len(answers) == 10 * len(WRONG_ADMIN_CREDENTIALS)
    for key, answer in answers.items():
        assert answer.status_code == 401, key
        assert answer.json() == {"error": "a valid admin bearer token is required"}, key
        assert VAULT_CODE not in answer.text, key
    assert after == before
    assert before["users"] == ["alice", "bob"]
    # The routes are there: with the admin token the same request shows Bob's words.
    assert shown.status_code == 200
    assert VAULT_CODE in shown.text


async def test_without_an_admin_token_configured_the_admin_routes_do_not_exist(
    database_url: str, tmp_path: Path
) -> None:
    config = isolation_config(database_url, tmp_path, admin_token=None)
    async with running_gateway(config) as gateway:
        bob = WebUser(gateway, "bob", BOB_TOKEN)
        bobs = (await bob.say(BOB_WORDS))["session_id"]
        before = await everyones_state(gateway)
        answers = {}
        for method, path in admin_routes(bobs, "bob"):
            for header in (None, f"Bearer {ADMIN_TOKEN}", f"Bearer {BOB_TOKEN}"):
                headers = {"Authorization": header} if header else {}
                answers[method, path, header] = await gateway.client.request(
                    method, path, headers=headers
                )
        after = await everyones_state(gateway)

    assert {key: answer.status_code for key, answer in answers.items()} == dict.fromkeys(
        answers, 404
    )
    assert all(VAULT_CODE not in answer.text for answer in answers.values())
    assert after == before


# --- what the model sees -------------------------------------------------------------------


async def archive_idle_sessions(gateway: RunningGateway, *, count: int) -> None:
    """Run the archiving job until `count` sessions were archived: a turn still writing its
    transcript after its reply holds its user's lock, and the job skips that user for now."""
    archived = 0
    async with asyncio.timeout(5):
        while archived < count:
            archived += await gateway.runtime.jobs.archive_idle_sessions()
            await asyncio.sleep(0.02)
    assert archived == count


@pytest.fixture
def fake_api() -> Iterator[FakeAnthropicAPI]:
    with FakeAnthropicAPI() as api:
        yield api


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
