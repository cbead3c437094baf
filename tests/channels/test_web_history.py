"""The web page's history (`GET /web/v1/history`): the user's own web messages and the
replies, from a real gateway's database, oldest first; and the event stream of a real gateway
bringing a reply."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from storage.repositories.outbox import OutboxRepository
from tests.channels.web_channel_harness import open_stream
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway

ALICE_TOKEN = "t-alice-123456"
CLOSED_WEB = {"web": {"dev_open": False, "tokens": [{"token": ALICE_TOKEN, "user": "alice"}]}}


@pytest.fixture
async def gateway(database_url: str, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(gateway_config(database_url, tmp_path)) as running:
        yield running


async def history(gateway: RunningGateway, user: str, **params: str) -> dict[str, Any]:
    response = await gateway.client.get("/web/v1/history", params={"user": user, **params})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def converse(gateway: RunningGateway, user: str, *texts: str) -> list[dict[str, Any]]:
    """Send each text and wait for its reply, one after the other."""
    for count, text in enumerate(texts, start=1):
        accepted = await gateway.post(user, text, message_id=f"{user}-{count}")
        assert accepted.status_code == 202
        replies = await gateway.wait_for_replies(user, count, settle=0)
    return replies


async def test_the_history_shows_both_sides_oldest_first(gateway: RunningGateway) -> None:
    replies = await converse(gateway, "alice", "first question", "second <b>question</b>")
    await converse(gateway, "bob", "bob's own question")
    feed = await gateway.replies("alice")
    body = await history(gateway, "alice")
    messages = body["messages"]
    assert [(item["role"], item["message_id"]) for item in messages] == [
        ("user", "alice-1"),
        ("assistant", replies[0]["message_id"]),
        ("user", "alice-2"),
        ("assistant", replies[1]["message_id"]),
    ]
    user_item = messages[2]
    assert user_item["text"] == "second <b>question</b>"
    assert user_item["session_id"] == replies[1]["session_id"]
    assert user_item["thread_id"] is None
    assert user_item["in_reply_to"] is None
    assert set(user_item) == set(replies[1])  # the feed's fields
    # The replies are exactly the JSON feed's items, and the cursor the feed's.
    assert [messages[1], messages[3]] == feed["messages"]
    assert body["cursor"] == feed["cursor"]
    assert [item["in_reply_to"] for item in feed["messages"]] == ["alice-1", "alice-2"]


async def test_the_history_is_the_newest_messages_up_to_the_limit(gateway: RunningGateway) -> None:
    replies = await converse(gateway, "alice", "one", "two")
    body = await history(gateway, "alice", limit="3")
    assert [item["text"] for item in body["messages"]] == [
        replies[0]["text"],
        "two",
        replies[1]["text"],
    ]


async def test_a_deleted_sessions_messages_leave_the_history(gateway: RunningGateway) -> None:
    replies = await converse(gateway, "alice", "keep this out")
    await gateway.runtime.admin.delete_session(replies[0]["session_id"])
    assert (await history(gateway, "alice"))["messages"] == []


async def test_a_user_without_messages_has_an_empty_history(gateway: RunningGateway) -> None:
    assert await history(gateway, "nobody") == {"messages": [], "cursor": "0"}


async def test_the_history_is_refused_as_the_feed_is(tmp_path: Path) -> None:
    config = gateway_config(
        f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}", tmp_path, channels=CLOSED_WEB
    )
    async with running_gateway(config) as gateway:
        missing = await gateway.client.get("/web/v1/history", params={"user": "alice"})
        other = await gateway.client.get(
            "/web/v1/history",
            params={"user": "bob"},
            headers={"authorization": f"Bearer {ALICE_TOKEN}"},
        )
        bad_limit = await gateway.client.get(
            "/web/v1/history",
            params={"limit": "0"},
            headers={"authorization": f"Bearer {ALICE_TOKEN}"},
        )
        own = await gateway.client.get(
            "/web/v1/history", headers={"authorization": f"Bearer {ALICE_TOKEN}"}
        )
    assert (missing.status_code, other.status_code, bad_limit.status_code) == (401, 403, 400)
    assert own.json() == {"messages": [], "cursor": "0"}


async def test_a_gateways_stream_brings_its_reply_and_one_committed_by_another_process(
    gateway: RunningGateway,
) -> None:
    async with open_stream(gateway.client) as events:
        await gateway.post("alice", "hello there", message_id="m-1")
        seen = await events.until("message")
        # Another process's reply: written to the database only, nobody here is told.
        async with gateway.runtime.database.session() as db:
            await OutboxRepository(db).enqueue(
                message_id="elsewhere-1",
                channel_type="web",
                channel_id="alice",
                content="answered by another process",
                at=gateway.clock(),
                delivered=True,
            )
        elsewhere = await events.next()
    reply = seen[-1]
    assert reply.data["in_reply_to"] == "m-1"
    assert reply.data == (await gateway.replies("alice"))["messages"][0]
    assert (elsewhere.name, elsewhere.data["text"]) == ("message", "answered by another process")
    assert int(elsewhere.id or 0) > int(reply.id or 0)
