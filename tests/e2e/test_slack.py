"""Slack end to end: signed Events API requests in, `chat.postMessage` out through a fake Slack
Web API, a whole gateway in between."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from channels.base import ChannelType, OutboundMessage
from gateway.runtime import GatewayRuntime
from storage.models import ExportLink, InboundEvent, Session, SessionChannel, SessionMessage
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway
from tests.fakes.slack_api import (
    BOT_USER,
    SIGNING_SECRET,
    TEAM,
    FakeSlackAPI,
    SlackFailure,
    direct_message,
    event_envelope,
    send_event,
    send_shortcut,
    sign,
)


def slack_config(database_url: str, tmp_path: Path, api: FakeSlackAPI, **slack: Any) -> Any:
    return gateway_config(
        database_url,
        tmp_path,
        identity={
            "users": [
                {"id": "alice", "org": "acme", "name": "Alice", "slack": [f"{TEAM}:U0001"]},
                {"id": "bob", "org": "acme", "name": "Bob", "email": ["bob@acme.example"]},
            ],
            **slack.pop("identity", {}),
        },
        channels={
            "slack": {
                "enabled": True,
                "bot_token": "xoxb-test",
                "signing_secret": SIGNING_SECRET,
                "api_base_url": api.url,
                **slack,
            }
        },
    )


async def wait_for_posts(
    api: FakeSlackAPI, count: int, *, timeout: float = 15.0, settle: float = 0.4
) -> list[dict[str, Any]]:
    """Wait until `count` messages were posted; then fail if more arrive within `settle`."""
    deadline = time.monotonic() + timeout
    while len(api.posts()) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(api.posts())} of {count} posts after {timeout}s")
        await asyncio.sleep(0.05)
    await asyncio.sleep(settle)
    posts = api.posts()
    assert len(posts) == count, posts
    return posts


async def rows(gateway: RunningGateway, model: Any) -> list[Any]:
    async with gateway.runtime.database.session() as db:
        return list((await db.execute(select(model))).scalars())


async def test_a_signed_dm_gets_exactly_one_reply_also_when_slack_retries_it_three_times(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    envelope = event_envelope(direct_message("What is an anvil?", ts="1700000000.000100"), "Ev1")
    async with running_gateway(slack_config(database_url, tmp_path, slack_api)) as gateway:
        first = await send_event(gateway.client, envelope)
        retries = [await send_event(gateway.client, envelope, retry=n) for n in (1, 2, 3)]
        (post,) = await wait_for_posts(slack_api, 1)
        events = await rows(gateway, InboundEvent)
    assert [first.status_code] + [r.status_code for r in retries] == [200] * 4
    assert len(events) == 1
    assert post["channel"] == "D0001"
    assert "thread_ts" not in post
    assert "What is an anvil?" in post["text"]


async def test_the_web_api_calls_of_many_replies_share_one_connection(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    async with running_gateway(slack_config(database_url, tmp_path, slack_api)) as gateway:
        for number in range(3):
            event = direct_message(f"Question {number}?", ts=f"170000000{number}.000100")
            await send_event(gateway.client, event_envelope(event, f"EvPool{number}"))
            await wait_for_posts(slack_api, number + 1, settle=0)
    posts = [call for call in slack_api.calls if call.method == "chat.postMessage"]
    assert len(posts) == 3
    # auth.test at start-up and every post: one pooled connection, not one per call.
    assert len({call.peer for call in slack_api.calls}) == 1


async def test_a_turn_workers_replies_share_one_connection_and_it_checks_no_token(
    migrated_postgres_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    """A turn worker (`gateway run --role turns`) sends replies but accepts nothing: it opens
    the Web API's pool without the accepting process's checks, and its posts share it."""
    config = slack_config(migrated_postgres_url, tmp_path, slack_api)
    runtime = await GatewayRuntime.start(config, role="turns")
    try:
        adapter = runtime.adapters[ChannelType.SLACK]
        for number in range(3):
            reply = OutboundMessage(
                message_id=f"out-{number}",
                channel_type=ChannelType.SLACK,
                channel_id="D0001",
                content=f"Answer {number}",
            )
            await adapter.send(reply)
    finally:
        await runtime.close()
    assert [call.method for call in slack_api.calls] == ["chat.postMessage"] * 3
    assert len({call.peer for call in slack_api.calls}) == 1


async def test_a_dm_in_a_thread_is_answered_in_that_thread(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    event = direct_message("And in a thread?", ts="1700000001.000200", thread_ts="1700000000.1")
    async with running_gateway(slack_config(database_url, tmp_path, slack_api)) as gateway:
        answer = await send_event(gateway.client, event_envelope(event, "Ev2"))
        (post,) = await wait_for_posts(slack_api, 1)
    assert answer.status_code == 200
    assert (post["channel"], post["thread_ts"]) == ("D0001", "1700000000.1")


async def test_a_mention_starts_a_thread_and_replies_in_it_continue_the_session(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    mention = {
        "type": "app_mention",
        "channel": "C0001",
        "user": "U0001",
        "text": f"<@{BOT_USER}> what do we know about Acme?",
        "ts": "1700000100.000100",
        "event_ts": "1700000100.000100",
    }
    reply = {
        "type": "message",
        "channel": "C0001",
        "channel_type": "channel",
        "user": "U0001",
        "text": "and their anvils?",
        "ts": "1700000200.000100",
        "thread_ts": "1700000100.000100",
    }
    foreign = {**reply, "ts": "1700000300.000100", "thread_ts": "1600000000.000001"}
    async with running_gateway(slack_config(database_url, tmp_path, slack_api)) as gateway:
        await send_event(gateway.client, event_envelope(mention, "EvM"))
        await wait_for_posts(slack_api, 1)
        await send_event(gateway.client, event_envelope(reply, "EvR"))
        await send_event(gateway.client, event_envelope(foreign, "EvF"))
        posts = await wait_for_posts(slack_api, 2)
        (session,) = await rows(gateway, Session)
        channels = await rows(gateway, SessionChannel)
        messages = await rows(gateway, SessionMessage)
    assert [(p["channel"], p["thread_ts"]) for p in posts] == [("C0001", "1700000100.000100")] * 2
    assert [(c.channel_type, c.channel_id, c.thread_id) for c in channels] == [
        ("slack", "C0001", "1700000100.000100")
    ]
    assert [m.content for m in messages if m.role == "user"] == [
        "what do we know about Acme?",
        "and their anvils?",
    ]
    assert {m.session_id for m in messages} == {session.id}


async def test_a_shared_message_reaches_the_session_as_forwarded_content(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    slack_api.people["U0009"] = {
        "id": "U0009",
        "name": "carol",
        "profile": {"display_name": "Carol"},
    }
    shortcut = {
        "type": "message_action",
        "callback_id": "send_to_assistant",
        "trigger_id": "13345224609.738474920.8088930838d88f008e0",
        "action_ts": "1700000400.000100",
        "team": {"id": TEAM, "domain": "acme"},
        "user": {"id": "U0001", "username": "alice", "team_id": TEAM},
        "channel": {"id": "C0002", "name": "deals"},
        "message": {
            "type": "message",
            "user": "U0009",
            "text": "Acme signed for 300 anvils, delivery in March.",
            "ts": "1700000350.000200",
        },
        "message_ts": "1700000350.000200",
        "response_url": "https://hooks.slack.com/app/T0001/1/abc",
    }
    async with running_gateway(slack_config(database_url, tmp_path, slack_api)) as gateway:
        answer = await send_shortcut(gateway.client, shortcut)
        (post,) = await wait_for_posts(slack_api, 1)
        (message, _answer) = sorted(await rows(gateway, SessionMessage), key=lambda m: m.seq)
        channels = await rows(gateway, SessionChannel)
    assert answer.status_code == 200
    assert post["channel"] == "U0001"
    assert "Acme signed for 300 anvils" in message.content
    assert "Forwarded message from Carol" in message.content
    assert [(c.channel_type, c.channel_id) for c in channels] == [("slack", "U0001")]


async def test_a_rate_limited_reply_waits_for_retry_after_and_is_posted_once(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    slack_api.script.extend([SlackFailure(429, "ratelimited", "1"), SlackFailure(503, "", None)])
    envelope = event_envelope(direct_message("hello", ts="1700000500.000100"), "Ev429")
    async with running_gateway(slack_config(database_url, tmp_path, slack_api)) as gateway:
        await send_event(gateway.client, envelope)
        (post,) = await wait_for_posts(slack_api, 1, timeout=20)
    attempts = [call for call in slack_api.calls if call.method == "chat.postMessage"]
    assert len(attempts) == 3
    assert attempts[1].at - attempts[0].at >= 0.9  # Retry-After: 1
    assert "hello" in post["text"]


async def test_bad_requests_get_clear_answers_and_reach_nobody(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    envelope = event_envelope(direct_message("hi", ts="1700000600.000100"), "EvBad")
    body = json.dumps(envelope).encode()
    async with running_gateway(slack_config(database_url, tmp_path, slack_api)) as gateway:
        client = gateway.client
        unsigned = await client.post("/slack/events", content=body)
        wrong = await client.post(
            "/slack/events", content=body, headers=sign(body, secret="not-the-secret")
        )
        stale = await client.post(
            "/slack/events", content=body, headers=sign(body, timestamp=int(time.time()) - 600)
        )
        garbage = b"{not json"
        malformed = await client.post(
            "/slack/events",
            content=garbage,
            headers={"Content-Type": "application/json", **sign(garbage)},
        )
        unknown = await send_event(
            client, event_envelope({"type": "emoji_changed", "subtype": "add"}, "EvEmoji")
        )
        challenge = await send_event(
            client, {"token": "t", "challenge": "3eZbrw1aB", "type": "url_verification"}
        )
        events = await rows(gateway, InboundEvent)
    assert (unsigned.status_code, wrong.status_code, stale.status_code) == (401, 401, 401)
    assert "stale" in stale.json()["error"]
    assert malformed.status_code == 400
    assert unknown.status_code == 200
    assert challenge.json() == {"challenge": "3eZbrw1aB"}
    assert events == []
    assert slack_api.posts() == []


async def test_events_from_a_workspace_not_allowed_are_refused(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    config = slack_config(database_url, tmp_path, slack_api, allowed_team_ids=["T0001"])
    stranger = event_envelope(direct_message("hi", ts="1.1"), "EvStranger", team="T9999")
    async with running_gateway(config) as gateway:
        answer = await send_event(gateway.client, stranger)
        events = await rows(gateway, InboundEvent)
    assert answer.status_code == 403
    assert events == []


async def test_an_oversized_message_gets_a_polite_reply_once_and_is_not_processed(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    config = slack_config(database_url, tmp_path, slack_api, max_text_chars=100)
    envelope = event_envelope(direct_message("x" * 101, ts="1700000700.000100"), "EvLong")
    async with running_gateway(config) as gateway:
        await send_event(gateway.client, envelope)
        await send_event(gateway.client, envelope, retry=1)
        (post,) = await wait_for_posts(slack_api, 1)
        events = await rows(gateway, InboundEvent)
    assert "too long" in post["text"]
    assert events == []


async def test_an_unknown_slack_user_is_linked_by_the_email_in_their_profile(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    slack_api.people["U0002"] = {
        "id": "U0002",
        "name": "bob",
        "profile": {"display_name": "Bob", "email": "Bob@Acme.example"},
    }
    config = slack_config(database_url, tmp_path, slack_api, identity={"link_by_email": True})
    envelope = event_envelope(direct_message("hi", user="U0002", ts="1700000800.1"), "EvBob")
    async with running_gateway(config) as gateway:
        await send_event(gateway.client, envelope)
        await wait_for_posts(slack_api, 1)
        (session,) = await rows(gateway, Session)
    assert session.user_id == "bob"


async def test_export_in_a_slack_dm_uploads_the_session_as_a_file(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    async with running_gateway(slack_config(database_url, tmp_path, slack_api)) as gateway:
        hello = event_envelope(direct_message("remember the anvil", ts="1700000900.1"), "EvH")
        await send_event(gateway.client, hello)
        await wait_for_posts(slack_api, 1)
        export = event_envelope(direct_message("/export", ts="1700000901.1"), "EvX")
        await send_event(gateway.client, export)
        posts = await wait_for_posts(slack_api, 2)
    (upload,) = slack_api.uploads.values()
    assert "is attached" in posts[1]["text"]
    assert upload["channel"] == "D0001"
    assert upload["filename"].endswith(".json")
    exported = json.loads(upload["content"])
    assert exported["messages"][0]["content"] == "remember the anvil"


async def test_export_in_a_channel_thread_is_refused_there_and_nothing_is_uploaded_or_linked(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    mention = {
        "type": "app_mention",
        "channel": "C0001",
        "user": "U0001",
        "text": f"<@{BOT_USER}> hello team",
        "ts": "1700001000.000100",
        "event_ts": "1700001000.000100",
    }
    export = {
        "type": "message",
        "channel": "C0001",
        "channel_type": "channel",
        "user": "U0001",
        "text": "/export",
        "ts": "1700001001.000100",
        "thread_ts": "1700001000.000100",
    }
    async with running_gateway(slack_config(database_url, tmp_path, slack_api)) as gateway:
        secret = event_envelope(direct_message("the vault code is PLUM-4471", ts="1.1"), "EvS")
        await send_event(gateway.client, secret)
        await wait_for_posts(slack_api, 1)
        await send_event(gateway.client, event_envelope(mention, "EvM2"))
        await wait_for_posts(slack_api, 2)
        await send_event(gateway.client, event_envelope(export, "EvX2"))
        posts = await wait_for_posts(slack_api, 3)
        links = await rows(gateway, ExportLink)
    refusal = posts[2]
    assert (refusal["channel"], refusal["thread_ts"]) == ("C0001", "1700001000.000100")
    assert "only send them in a direct message" in refusal["text"]
    assert "/web/v1/exports/" not in refusal["text"]
    assert slack_api.uploads == {}
    assert links == []
