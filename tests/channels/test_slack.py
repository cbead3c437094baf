"""The Slack adapter on its own: start-up checks, acknowledgements, Socket Mode, sending."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import httpx
import pytest
import yaml
from aiohttp import web
from starlette.applications import Starlette
from structlog.testing import capture_logs

from channels.base import (
    ChannelType,
    FileToSend,
    OutboundMessage,
)
from channels.slack.adapter import SlackChannel, SlackSettings
from channels.slack.parse import SHORTCUT_CALLBACK_ID
from errors import ChannelAuthError, DeliveryError, StorageError
from tests.channels.slack_doubles import NoThreads, RecordingInbox
from tests.e2e.harness import free_port
from tests.fakes.slack_api import (
    SIGNING_SECRET,
    FakeSlackAPI,
    SlackFailure,
    direct_message,
    event_envelope,
    send_event,
)

MANIFEST = Path(__file__).resolve().parents[2] / "config" / "slack-app-manifest.yaml"


def settings(api: FakeSlackAPI, **fields: object) -> SlackSettings:
    values: dict[str, object] = {
        "bot_token": "xoxb-test",
        "signing_secret": SIGNING_SECRET,
        "api_base_url": api.url,
        **fields,
    }
    return SlackSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
async def served(slack_api: FakeSlackAPI) -> AsyncIterator[tuple[SlackChannel, RecordingInbox]]:
    inbox = RecordingInbox()
    channel = SlackChannel(settings(slack_api), inbox, NoThreads())
    await channel.start()
    yield channel, inbox
    await channel.stop()


def client_for(channel: SlackChannel) -> httpx.AsyncClient:
    app = Starlette(routes=channel.routes())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://slack.test")


def test_http_mode_refuses_to_start_without_a_signing_secret(slack_api: FakeSlackAPI) -> None:
    with pytest.raises(ChannelAuthError, match="signing_secret"):
        SlackChannel(settings(slack_api, signing_secret=" "), RecordingInbox(), NoThreads())


def test_socket_mode_needs_no_signing_secret(slack_api: FakeSlackAPI) -> None:
    channel = SlackChannel(
        settings(slack_api, signing_secret="", mode="socket", app_token="xapp-1"),
        RecordingInbox(),
        NoThreads(),
    )
    assert channel.settings.mode == "socket"


async def test_a_token_slack_refuses_stops_the_start(slack_api: FakeSlackAPI) -> None:
    slack_api.auth_error = "invalid_auth"
    channel = SlackChannel(settings(slack_api), RecordingInbox(), NoThreads())
    with pytest.raises(ChannelAuthError, match="invalid_auth"):
        await channel.start()


async def test_an_event_is_acknowledged_only_after_the_inbox_committed_it(
    served: tuple[SlackChannel, RecordingInbox],
) -> None:
    channel, inbox = served
    async with client_for(channel) as client:
        answer = await send_event(
            client, event_envelope(direct_message("hi", ts="1700000000.1"), "Ev1")
        )
    assert answer.status_code == 200
    assert [m.message_id for m in inbox.messages] == ["Ev1"]


async def test_a_reloaded_workspace_allow_list_and_text_limit_apply_to_the_next_event(
    served: tuple[SlackChannel, RecordingInbox],
) -> None:
    channel, inbox = served
    channel.reconfigure(
        dataclasses.replace(channel.settings, allowed_team_ids=frozenset({"T0OTHER"}))
    )
    async with client_for(channel) as client:
        refused = await send_event(
            client, event_envelope(direct_message("hi", ts="1700000000.1"), "Ev1")
        )
        channel.reconfigure(dataclasses.replace(channel.settings, allowed_team_ids=frozenset()))
        channel.reconfigure(dataclasses.replace(channel.settings, max_text_chars=3))
        too_long = await send_event(
            client, event_envelope(direct_message("hello", ts="1700000000.2"), "Ev2")
        )
        channel.reconfigure(dataclasses.replace(channel.settings, max_text_chars=16_000))
        accepted = await send_event(
            client, event_envelope(direct_message("hello", ts="1700000000.3"), "Ev3")
        )
    assert refused.status_code == 403  # a workspace the reloaded allow-list leaves out
    assert too_long.status_code == 200
    assert accepted.status_code == 200
    assert [m.message_id for m in inbox.messages] == ["Ev3"]


async def test_an_inbox_failure_answers_503_so_slack_retries(slack_api: FakeSlackAPI) -> None:
    inbox = RecordingInbox(StorageError("database down"))
    channel = SlackChannel(settings(slack_api), inbox, NoThreads())
    async with client_for(channel) as client:
        answer = await send_event(
            client, event_envelope(direct_message("hi", ts="1700000000.1"), "Ev1")
        )
    assert answer.status_code == 503


async def test_a_channel_reply_in_a_thread_that_is_not_ours_is_ignored(
    served: tuple[SlackChannel, RecordingInbox],
) -> None:
    channel, inbox = served
    reply = {
        "type": "message",
        "channel": "C0001",
        "channel_type": "channel",
        "user": "U0001",
        "text": "not for the bot",
        "ts": "1700000200.1",
        "thread_ts": "1700000100.1",
    }
    async with client_for(channel) as client:
        answer = await send_event(client, event_envelope(reply, "EvX"))
    assert answer.status_code == 200
    assert inbox.messages == []


async def test_mentions_are_spelled_with_display_names(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI
) -> None:
    slack_api.people["U0042"] = {"id": "U0042", "profile": {"display_name": "Dana"}}
    channel, inbox = served
    event = direct_message("ask <@U0042> and <@U0043>", ts="1700000000.1")
    async with client_for(channel) as client:
        await send_event(client, event_envelope(event, "EvN"))
    assert inbox.messages[0].content == "ask @Dana and @U0043"


async def test_a_long_answer_is_posted_in_pieces_and_a_retry_continues_where_it_failed(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI
) -> None:
    channel, _inbox = served
    paragraphs = [f"**Part {n}**\n" + "word " * 700 for n in range(3)]
    reply = OutboundMessage(
        message_id="out-1",
        channel_type=ChannelType.SLACK,
        channel_id="C0001",
        content="\n\n".join(paragraphs),
        thread_id="1700000100.1",
        reply_context={"channel": "C0001", "thread_ts": "1700000100.1"},
    )
    slack_api.fail_attempts[2] = SlackFailure(429, "ratelimited", "3")
    with pytest.raises(DeliveryError) as failure:
        await channel.send(reply)
    assert failure.value.retry_after == 3.0
    assert not failure.value.permanent
    receipt = await channel.send(reply)
    posts = slack_api.posts("C0001")
    assert len(posts) == 3  # each piece once, though the second failed the first time
    assert [p["thread_ts"] for p in posts] == ["1700000100.1"] * 3
    assert posts[0]["text"].startswith("*Part 0*")
    assert all(len(p["text"]) <= 3900 for p in posts)
    assert receipt.platform_message_id == posts[0]["ts"]


async def test_a_resumed_reply_posts_only_the_pieces_slack_does_not_hold_yet(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI
) -> None:
    channel, _inbox = served
    paragraphs = [f"**Part {n}**\n" + "word " * 700 for n in range(3)]
    reply = OutboundMessage(
        message_id="out-r",
        channel_type=ChannelType.SLACK,
        channel_id="C0001",
        content="\n\n".join(paragraphs),
        thread_id="1700000100.1",
        reply_context={"channel": "C0001", "thread_ts": "1700000100.1", "ts": "1700000100.2"},
    )
    # The first sender posted a piece and died (its memory of the pieces died with it).
    slack_api.fail_attempts[2] = SlackFailure(500, "internal_error", None)
    with pytest.raises(DeliveryError):
        await channel.send(reply)
    other_process = SlackChannel(settings(slack_api), RecordingInbox(), NoThreads())
    await other_process.start()
    try:
        receipt = await other_process.send(dataclasses.replace(reply, resumed=True))
        # A reply not resumed is not looked up: Slack is asked only after a crash.
        await other_process.send(dataclasses.replace(reply, message_id="out-s"))
    finally:
        await other_process.stop()
    posts = slack_api.posts("C0001")
    assert [p["metadata"]["event_payload"] for p in posts] == [
        {"reply": "out-r", "piece": 0},
        {"reply": "out-r", "piece": 1},
        {"reply": "out-r", "piece": 2},
        {"reply": "out-s", "piece": 0},
        {"reply": "out-s", "piece": 1},
        {"reply": "out-s", "piece": 2},
    ]
    assert receipt.platform_message_id == posts[0]["ts"]
    [lookup] = slack_api.calls_to("conversations.replies")
    assert lookup.params["ts"] == "1700000100.1"
    assert lookup.params["oldest"] == "1700000100.2"


async def test_a_resumed_reply_slack_will_not_show_is_posted_again(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI
) -> None:
    channel, _inbox = served
    reply = OutboundMessage(
        "out-m", ChannelType.SLACK, "D0001", "hello", reply_context={"channel": "D0001"}
    )
    await channel.send(reply)
    slack_api.refuse["conversations.history"] = "missing_scope"
    with capture_logs() as logs:
        await channel.send(dataclasses.replace(reply, resumed=True))
    assert len(slack_api.posts("D0001")) == 2  # at least once, as without the lookup
    assert any(
        entry["event"] == "slack.resend_unchecked" and entry["reason"] == "missing_scope"
        for entry in logs
    )
    slack_api.refuse.pop("conversations.history")
    slack_api.fail("conversations.history", SlackFailure(429, "ratelimited", "7"))
    with pytest.raises(DeliveryError) as failure:
        await channel.send(dataclasses.replace(reply, resumed=True))
    assert failure.value.retry_after == 7.0  # asked again later, never posted blind
    assert len(slack_api.posts("D0001")) == 2


async def test_a_reply_slack_refuses_for_good_is_a_permanent_failure(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI
) -> None:
    channel, _inbox = served
    slack_api.script.append(SlackFailure(200, "channel_not_found", None))
    reply = OutboundMessage("out-2", ChannelType.SLACK, "C0404", "hello")
    with pytest.raises(DeliveryError) as failure:
        await channel.send(reply)
    assert failure.value.permanent


def export_reply(conversation: str) -> OutboundMessage:
    """A reply carrying a session export, addressed to `conversation` in a thread."""
    return OutboundMessage(
        message_id=f"out-export-{conversation}",
        channel_type=ChannelType.SLACK,
        channel_id=conversation,
        content="Your export is attached.",
        thread_id="1700000300.1",
        reply_context={"channel": conversation, "thread_ts": "1700000300.1"},
        file=FileToSend("session-export.json", "application/json", '{"messages": []}'),
    )


@pytest.mark.parametrize("conversation", ["C0001", "G0001"])
async def test_a_reply_with_a_file_to_a_shared_conversation_is_refused_before_anything_is_posted(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI, conversation: str
) -> None:
    channel, _inbox = served
    reply = export_reply(conversation)
    with capture_logs() as logged, pytest.raises(DeliveryError) as failure:
        await channel.send(reply)

    assert failure.value.permanent
    assert "session-export.json" in str(failure.value)
    methods = [call.method for call in slack_api.calls]
    assert "chat.postMessage" not in methods
    assert not [method for method in methods if method.startswith("files.")]
    assert slack_api.uploads == {}
    (refusal,) = [line for line in logged if line["event"] == "slack.file_refused"]
    assert refusal["channel"] == conversation
    assert refusal["reply_id"] == reply.message_id


async def test_a_reply_with_a_file_to_a_direct_message_posts_the_text_and_uploads_the_file(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI
) -> None:
    channel, _inbox = served
    with capture_logs() as logged:
        receipt = await channel.send(export_reply("D0001"))

    (post,) = slack_api.posts("D0001")
    assert post["text"] == "Your export is attached."
    assert post["thread_ts"] == "1700000300.1"
    assert receipt.platform_message_id == post["ts"]
    (upload,) = slack_api.uploads.values()
    assert upload["channel"] == "D0001"
    assert upload["thread_ts"] == "1700000300.1"
    assert upload["filename"] == "session-export.json"
    assert upload["content"] == '{"messages": []}'
    assert not [line for line in logged if line["event"] == "slack.file_refused"]


async def test_socket_mode_receives_an_event_and_acknowledges_it_after_the_inbox(
    slack_api: FakeSlackAPI,
) -> None:
    acks: asyncio.Queue[dict[str, object]] = asyncio.Queue()
    envelope = {
        "envelope_id": "57d6a792-4d35-4d0b-b6aa-3361493e1caf",
        "type": "events_api",
        "accepts_response_payload": False,
        "retry_attempt": 0,
        "payload": event_envelope(direct_message("over the socket", ts="1700000000.2"), "EvS"),
    }

    async def socket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"type": "hello", "num_connections": 1})
        await ws.send_json(envelope)
        async for frame in ws:
            if frame.type == aiohttp.WSMsgType.TEXT:
                await acks.put(json.loads(frame.data))
        return ws

    app = web.Application()
    app.router.add_get("/link", socket)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    slack_api.socket_url = f"ws://127.0.0.1:{port}/link"
    inbox = RecordingInbox()
    channel = SlackChannel(
        settings(slack_api, signing_secret="", mode="socket", app_token="xapp-1"),
        inbox,
        NoThreads(),
    )
    try:
        await channel.start()
        ack = await asyncio.wait_for(acks.get(), timeout=10)
    finally:
        await channel.stop()
        await runner.cleanup()
    assert ack["envelope_id"] == envelope["envelope_id"]
    assert [m.content for m in inbox.messages] == ["over the socket"]


def test_the_app_manifest_declares_what_the_adapter_uses() -> None:
    manifest = yaml.safe_load(MANIFEST.read_text())
    (shortcut,) = manifest["features"]["shortcuts"]
    assert (shortcut["type"], shortcut["callback_id"]) == ("message", SHORTCUT_CALLBACK_ID)
    events = set(manifest["settings"]["event_subscriptions"]["bot_events"])
    assert {"app_mention", "message.im", "message.channels", "message.groups"} <= events
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    assert {"chat:write", "im:history", "app_mentions:read", "users:read.email"} <= scopes
    request_urls = {
        manifest["settings"]["event_subscriptions"]["request_url"],
        manifest["settings"]["interactivity"]["request_url"],
    }
    assert {url.rpartition("/")[0].rpartition("/")[2] for url in request_urls} == {"slack"}
    assert all(url.endswith("/slack/events") for url in request_urls)
