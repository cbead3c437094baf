"""Isolation between users through chat commands: whatever Alice sends on the web, on Slack
(in her DM, in Bob's thread of a shared channel) or by email (even as an answer to Bob's
reply), she never resumes, exports, forgets or joins Bob's session, and nothing of his comes
back to her."""

from __future__ import annotations

import asyncio
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from sqlalchemy import select

from storage.models import OutboundMessage
from tests.channels.email_mail import deliver
from tests.e2e.harness import free_port, running_gateway
from tests.fakes.slack_api import SIGNING_SECRET, FakeSlackAPI
from tests.fakes.smtp_sink import Delivery, SmtpSink
from tests.reliability.isolation import (
    ALICE_EMAIL,
    ALICE_TOKEN,
    ALICE_WORDS,
    ASSISTANT,
    BOB_EMAIL,
    BOB_TOKEN,
    BOB_WORDS,
    VAULT_CODE,
    SlackUser,
    WebUser,
    assert_nothing_of_bob,
    isolation_config,
    session_state,
    stored_transcript,
)

# --- the web ------------------------------------------------------------------------------


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


# --- Slack --------------------------------------------------------------------------------


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
