"""Teams live replies through a whole gateway: signed activities in, a fake Bot Connector that
speaks the stream protocol out. A personal chat sees the answer stream and one final message
that is the stored reply; the user's Stop ends the stream quietly; group chats and channels see
typing and one plain message; with streaming off, one plain message only."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from structlog.testing import capture_logs

from storage.models import InboundEvent, OutboundMessage
from tests.channels.teams_activities import (
    ALICE_AAD,
    PERSONAL_CONVERSATION,
    TEAM_CHANNEL,
    TENANT,
    channel_mention,
    personal_message,
)
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway
from tests.fakes.bot_framework import APP_ID, APP_PASSWORD, FakeBotFramework, PostedActivity

# Long enough that the offline model, at 100 ms a word, writes its answer for about 4 s.
QUESTION = (
    "please tell me what you know about anvils and hammers and forges and the smiths who use them"
)


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only: what these tests watch is the conversation with Teams; the stored live
    handle and the turn's writes are proven on PostgreSQL too (tests/reliability/
    test_live_faults.py, tests/e2e/test_live_web.py)."""
    return f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotFramework]:
    async with FakeBotFramework() as server:
        yield server


def teams_config(
    database_url: str, tmp_path: Path, fake: FakeBotFramework, *, streaming: bool = True
) -> Any:
    """A gateway with the Teams channel on the fake, whose model writes word by word."""
    return gateway_config(
        database_url,
        tmp_path,
        llm={"offline_token_interval": "100ms"},
        identity={"users": [{"id": "alice", "org": "acme", "teams": [ALICE_AAD]}]},
        channels={
            "teams": {
                "enabled": True,
                "app_id": APP_ID,
                "app_password": APP_PASSWORD,
                "tenant_ids": [TENANT],
                "openid_metadata_url": fake.openid_metadata_url,
                "oauth_token_url": fake.token_url,
                "streaming": streaming,
            }
        },
    )


def group_chat_message(fake: FakeBotFramework) -> dict[str, Any]:
    """A mention of the bot in a group chat (no reply chains there)."""
    activity = channel_mention(fake)
    activity["conversation"] = {
        "id": "19:group-chat@thread.v2",
        "conversationType": "groupChat",
        "isGroup": True,
        "tenantId": TENANT,
    }
    del activity["replyToId"]
    return activity


async def send(gateway: RunningGateway, fake: FakeBotFramework, activity: dict[str, Any]) -> None:
    answer = await gateway.client.post("/api/messages", json=activity, headers=fake.bearer())
    assert answer.status_code == 200, answer.text


async def replies(gateway: RunningGateway) -> list[OutboundMessage]:
    async with gateway.runtime.database.session() as db:
        return list(
            (await db.execute(select(OutboundMessage).order_by(OutboundMessage.id))).scalars()
        )


async def events(gateway: RunningGateway) -> list[InboundEvent]:
    async with gateway.runtime.database.session() as db:
        return list((await db.execute(select(InboundEvent).order_by(InboundEvent.id))).scalars())


async def delivered(
    gateway: RunningGateway, count: int, timeout: float = 30.0
) -> list[OutboundMessage]:
    """The replies once `count` of them are delivered (the outbox marks them after the send)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = await replies(gateway)
        if sum(row.status == "delivered" for row in rows) >= count:
            return rows
        assert time.monotonic() < deadline, [(row.id, row.status) for row in rows]
        await asyncio.sleep(0.05)


async def quiet_after(fake: FakeBotFramework, seconds: float = 1.2) -> None:
    """Wait as long as the chat's pace would let another request come: none may."""
    before = len(fake.requests)
    await asyncio.sleep(seconds)
    assert len(fake.requests) == before, fake.requests[before:]


def streamed(fake: FakeBotFramework, stream_id: str) -> list[PostedActivity]:
    """The typing activities that continued the stream `stream_id` (its first is not among
    them: it had no id yet)."""
    return [post for post in fake.typing if (post.stream_info or {}).get("streamId") == stream_id]


def wire(post: PostedActivity) -> tuple[Any, ...]:
    info = post.stream_info or {}
    return (post.body["type"], info.get("streamType"), info.get("streamSequence"))


async def test_a_personal_chat_streams_the_answer_and_finishes_it_with_the_stored_reply(
    database_url: str, tmp_path: Path, fake: FakeBotFramework
) -> None:
    async with running_gateway(teams_config(database_url, tmp_path, fake)) as gateway:
        await send(gateway, fake, personal_message(fake, QUESTION))
        await fake.wait_for(lambda: bool(fake.finals()), timeout=30)
        (reply,) = await delivered(gateway, 1)
        await quiet_after(fake)
        (event,) = await events(gateway)

    first, *updates = fake.typing
    # The user's message → at once a status (which opened the stream) …
    assert wire(first) == ("typing", "informative", 1)
    assert "streamId" not in (first.stream_info or {})
    assert first.body["text"] == "Thinking…"
    assert first.conversation_id == PERSONAL_CONVERSATION
    (stream_id,) = fake.streams
    # … then the answer as it grows: cumulative text, increasing sequence, the stream's id.
    assert len(updates) >= 2, updates
    assert updates == streamed(fake, stream_id)
    assert [wire(post)[:2] for post in updates] == [("typing", "streaming")] * len(updates)
    sequences = [wire(post)[2] for post in [first, *updates]]
    assert sequences == sorted(set(sequences))
    texts = [post.body["text"] for post in updates]
    for shorter, longer in itertools.pairwise(texts):
        assert longer.startswith(shorter)
        assert len(longer) > len(shorter)
    # … and one message, the final of that stream, whose text is the stored reply.
    (final,) = fake.posted
    assert final.stream_info == {"type": "streaminfo", "streamId": stream_id, "streamType": "final"}
    assert final.body["text"] == reply.content
    assert reply.content.startswith(texts[-1])
    assert f"You said: «{QUESTION}»" in reply.content
    assert final.received_at > max(post.received_at for post in fake.typing)
    assert fake.streams[stream_id].ended == "final"
    # Never two requests to the chat within a second; nothing the connector had to refuse.
    assert fake.too_fast() == []
    assert fake.stream_errors == []
    # The stream is the reply's live message, stored with the inbound event too.
    assert reply.reply_context["live"]["stream_id"] == stream_id
    assert event.live_reply is not None
    assert event.live_reply["stream_id"] == stream_id
    assert (reply.status, event.status) == ("delivered", "done")


async def test_the_users_stop_ends_the_updates_and_the_turn_cleanly(
    database_url: str, tmp_path: Path, fake: FakeBotFramework
) -> None:
    fake.stop_streams_after(2)  # the status and one streamed text, then Stop
    async with running_gateway(teams_config(database_url, tmp_path, fake)) as gateway:
        with capture_logs() as logs:
            await send(gateway, fake, personal_message(fake, QUESTION))
            (stopped,) = await delivered(gateway, 1)
            await quiet_after(fake)
        shown, posted = list(fake.typing), list(fake.posted)
        (stream_id,) = fake.streams
        refused = len(fake.requests) - len(fake.typing) - len(fake.posted)
        fake.stop_after = None  # the user's next question is not stopped
        await send(gateway, fake, personal_message(fake, "and now?", activity_id="1717243200009"))
        await fake.wait_for(lambda: bool(fake.finals()), timeout=30)
        first, second = await delivered(gateway, 2)
        await quiet_after(fake)
        inbound = await events(gateway)

    # One update was refused (the Stop); none was sent after it, and no message either.
    assert [wire(post) for post in shown] == [
        ("typing", "informative", 1),
        ("typing", "streaming", 2),
    ]
    assert refused == 1
    assert posted == []
    assert fake.streams[stream_id].ended == "stopped"
    # The turn ended as any other: its reply stored (full text) and delivered, the event done.
    assert first.id == stopped.id
    assert first.status == "delivered"
    assert first.reply_context["live"]["stream_id"] == stream_id
    assert f"You said: «{QUESTION}»" in first.content
    names = [line["event"] for line in logs]
    assert "live.stopped_by_user" in names
    assert "turn.failed" not in names
    assert [line for line in logs if line["log_level"] in ("error", "critical")] == []
    assert [(event.status, event.attempts) for event in inbound] == [("done", 0), ("done", 0)]
    # The next question is answered normally: a new stream, finished by its one message.
    (final,) = fake.posted
    new_stream = (final.stream_info or {}).get("streamId")
    assert new_stream not in (None, stream_id)
    assert final.body["text"] == second.content
    assert "You said: «and now?»" in second.content
    assert second.status == "delivered"
    assert fake.streams[str(new_stream)].ended == "final"
    assert fake.too_fast() == []
    assert fake.stream_errors == []


@pytest.mark.parametrize(
    ("activity_of", "conversation_id"),
    [
        (
            lambda fake: channel_mention(fake, root="1717243100000"),
            f"{TEAM_CHANNEL};messageid=1717243100000",
        ),
        (group_chat_message, "19:group-chat@thread.v2"),
    ],
    ids=["channel", "group chat"],
)
async def test_group_chats_and_channels_show_typing_and_get_one_plain_message(
    database_url: str,
    tmp_path: Path,
    fake: FakeBotFramework,
    activity_of: Callable[[FakeBotFramework], dict[str, Any]],
    conversation_id: str,
) -> None:
    async with running_gateway(teams_config(database_url, tmp_path, fake)) as gateway:
        await send(gateway, fake, activity_of(fake))
        (reply,) = await delivered(gateway, 1)
        await quiet_after(fake)
        (event,) = await events(gateway)

    assert fake.typing, "no typing indicator"
    assert all(post.body["type"] == "typing" for post in fake.typing)
    assert all(post.stream_info is None for post in fake.typing)
    assert {post.conversation_id for post in fake.typing} == {conversation_id}
    (answer,) = fake.posted
    assert answer.stream_info is None
    assert answer.body["type"] == "message"
    assert answer.conversation_id == conversation_id
    assert answer.body["text"] == reply.content
    # The typing stopped when the answer came.
    assert max(post.received_at for post in fake.typing) < answer.received_at
    assert fake.streams == {}
    assert fake.too_fast() == []
    assert "live" not in reply.reply_context
    assert event.live_reply is None


async def test_with_streaming_off_a_personal_chat_gets_one_plain_message_and_nothing_live(
    database_url: str, tmp_path: Path, fake: FakeBotFramework
) -> None:
    config = teams_config(database_url, tmp_path, fake, streaming=False)
    async with running_gateway(config) as gateway:
        await send(gateway, fake, personal_message(fake, QUESTION))
        (reply,) = await delivered(gateway, 1)
        await quiet_after(fake)
        (event,) = await events(gateway)
    assert fake.typing == []
    assert fake.streams == {}
    (answer,) = fake.posted
    assert answer.stream_info is None
    assert answer.body["text"] == reply.content
    assert f"You said: «{QUESTION}»" in reply.content
    assert "live" not in reply.reply_context
    assert event.live_reply is None
    assert len(fake.requests) == 1
