"""Live replies in a Teams personal chat, against the fake Bot Connector over loopback: the
answer streams (informative, then cumulative streaming updates) and the committed reply's
final message ends the stream; the user's Stop, rate limits, the two-minute limit, retries
and restarts each still give exactly one reply."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

import pytest
from structlog.testing import capture_logs

from channels.live import LiveChannel, LiveStoppedError
from channels.teams.streaminfo import StreamInfoEntity, stream_update
from errors import DeliveryError
from tests.channels.teams_activities import PERSONAL_CONVERSATION, personal_message
from tests.channels.teams_channel_harness import NOW
from tests.channels.teams_live_harness import LiveHarness, live_channel, streamed_reply
from tests.fakes.bot_framework import FakeBotFramework


@pytest.fixture
async def live(fake: FakeBotFramework) -> AsyncIterator[LiveHarness]:
    async with live_channel(fake) as harness:
        yield harness


async def test_an_answer_streams_and_its_final_message_ends_the_stream(live: LiveHarness) -> None:
    message = await live.accepted(personal_message(live.fake))
    reply = live.live_reply(message)
    assert isinstance(live.teams.channel, LiveChannel)

    await reply.status("Searching earlier conversations…")
    handle = reply.handle
    await reply.text("The anvil")
    await reply.text("The anvil is heavy")
    receipt = await live.teams.channel.send(
        streamed_reply(message, handle, "The anvil is heavy.\n\n**Sources:** none")
    )

    assert handle == {
        "stream_id": "reply-1",
        "conversation_id": PERSONAL_CONVERSATION,
        "started_at": NOW.isoformat(),
    }
    entities = [post.stream_info for post in live.fake.typing]
    assert entities == [
        {"type": "streaminfo", "streamType": "informative", "streamSequence": 1},
        {
            "type": "streaminfo",
            "streamType": "streaming",
            "streamSequence": 2,
            "streamId": "reply-1",
        },
        {
            "type": "streaminfo",
            "streamType": "streaming",
            "streamSequence": 3,
            "streamId": "reply-1",
        },
    ]
    assert [post.body["text"] for post in live.fake.typing] == [
        "Searching earlier conversations…",
        "The anvil",
        "The anvil is heavy",
    ]
    [final] = live.fake.posted
    assert final.body["type"] == "message"
    assert final.stream_info == {"type": "streaminfo", "streamType": "final", "streamId": "reply-1"}
    assert final.body["text"] == "The anvil is heavy.\n\n**Sources:** none"
    assert final.reply_to_id == message.raw["id"]
    assert receipt.platform_message_id == "reply-1"
    assert live.fake.stream_errors == []
    assert live.fake.streams["reply-1"].ended == "final"


def test_the_stream_fields_reach_the_wire_which_a_plain_entity_would_drop() -> None:
    """botbuilder's `Entity` serialises only `type` (botbuilder-python #2231)."""
    activity = stream_update("Hi", stream_type="streaming", sequence=4, stream_id="s-1")
    [entity] = activity.serialize()["entities"]
    assert entity == {
        "type": "streaminfo",
        "streamId": "s-1",
        "streamType": "streaming",
        "streamSequence": 4,
    }
    assert isinstance(activity.entities[0], StreamInfoEntity)


async def test_the_pace_keeps_one_request_a_second_per_chat_updates_and_final_together(
    live: LiveHarness,
) -> None:
    message = await live.accepted(personal_message(live.fake))
    reply = live.live_reply(message)
    await reply.status("Thinking…")
    await reply.text("One")
    await reply.text("One two")
    await live.teams.channel.send(streamed_reply(message, reply.handle, "One two three."))
    # Four requests, each but the first waited for its second on the (virtual) clock.
    assert live.time.slept == [1.0, 1.0, 1.0]


async def test_a_status_after_the_text_streams_is_not_shown_and_a_replaced_text_waits(
    live: LiveHarness,
) -> None:
    message = await live.accepted(personal_message(live.fake))
    reply = live.live_reply(message)
    await reply.text("Let me look")
    await reply.status("Using the search tool…")  # the answer's text already shows
    await reply.text("Found it")  # the model started over: Teams only takes extensions
    await live.teams.channel.send(streamed_reply(message, reply.handle, "Found it: 42."))
    assert [post.body["text"] for post in live.fake.typing] == ["Let me look"]
    assert live.fake.posted[0].body["text"] == "Found it: 42."
    assert live.fake.stream_errors == []


async def test_the_users_stop_ends_the_updates_and_the_reply_posts_nothing_more(
    live: LiveHarness,
) -> None:
    message = await live.accepted(personal_message(live.fake))
    live.fake.stop_streams_after(2)
    reply = live.live_reply(message)
    await reply.status("Thinking…")
    await reply.text("Once upon")
    with pytest.raises(LiveStoppedError):
        await reply.text("Once upon a time")
    requests = len(live.fake.requests)
    with pytest.raises(LiveStoppedError):
        await reply.text("Once upon a time there")  # known: no request
    with capture_logs() as logs:
        receipt = await live.teams.channel.send(
            streamed_reply(message, reply.handle, "Once upon a time there was an anvil.")
        )
    assert len(live.fake.requests) == requests
    assert live.fake.posted == []
    assert receipt.platform_message_id == "reply-1"
    assert [line["event"] for line in logs] == ["teams.stream_stopped"]


async def test_a_stop_learnt_only_from_the_final_after_a_restart_posts_nothing_more(
    fake: FakeBotFramework,
) -> None:
    async with live_channel(fake) as before:
        message = await before.accepted(personal_message(fake))
        reply = before.live_reply(message)
        await reply.text("Once upon")
        handle = reply.handle
    fake.stop_streams_after(1)  # pressed while no process was streaming
    async with live_channel(fake) as after:
        with capture_logs() as logs:
            receipt = await after.teams.channel.send(streamed_reply(message, handle, "Done."))
    assert fake.posted == []
    assert receipt.platform_message_id == handle["stream_id"]
    assert "teams.stream_stopped" in [line["event"] for line in logs]


async def test_a_rate_limit_mid_stream_is_retryable_and_the_stream_goes_on(
    live: LiveHarness,
) -> None:
    message = await live.accepted(personal_message(live.fake))
    reply = live.live_reply(message)
    await reply.text("Alpha")
    live.fake.fail_next(429, {"Retry-After": "3"})
    with pytest.raises(DeliveryError) as raised:
        await reply.text("Alpha beta")
    assert (raised.value.retry_after, raised.value.permanent) == (3, False)
    await reply.text("Alpha beta gamma")
    await live.teams.channel.send(streamed_reply(message, reply.handle, "Alpha beta gamma."))
    assert [post.stream_info["streamSequence"] for post in live.fake.typing] == [1, 2]
    assert live.fake.typing[1].body["text"] == "Alpha beta gamma"
    assert len(live.fake.finals()) == 1
    assert live.fake.stream_errors == []


async def test_a_rate_limited_final_is_retried_and_finishes_the_stream(live: LiveHarness) -> None:
    message = await live.accepted(personal_message(live.fake))
    reply = live.live_reply(message)
    await reply.text("Alpha")
    outbound = streamed_reply(message, reply.handle, "Alpha.")
    live.fake.fail_next(429, {"Retry-After": "2"})
    with pytest.raises(DeliveryError) as raised:
        await live.teams.channel.send(outbound)
    assert raised.value.retry_after == 2
    await live.teams.channel.send(outbound)
    assert [post.body["text"] for post in live.fake.finals()] == ["Alpha."]


async def test_updates_stop_before_the_two_minutes_and_a_late_reply_is_a_plain_message(
    live: LiveHarness,
) -> None:
    message = await live.accepted(personal_message(live.fake))
    reply = live.live_reply(message)
    await reply.status("Thinking…")
    live.clock.advance(99)
    await reply.text("Still")
    live.clock.advance(2)  # 101 s: no more updates
    await reply.text("Still thinking")
    assert len(live.fake.typing) == 2
    live.clock.advance(20)  # 121 s: the stream is over on Teams' side
    outbound = streamed_reply(message, reply.handle, "Late.")
    receipt = await live.teams.channel.send(outbound)
    again = await live.teams.channel.send(outbound)  # the delivery mark was lost
    [plain] = live.fake.posted
    assert plain.stream_info is None
    assert plain.body["text"] == "Late."
    assert receipt.platform_message_id == "reply-2"
    assert again == receipt


async def test_a_final_the_connector_finds_too_late_becomes_a_plain_message(
    live: LiveHarness,
) -> None:
    message = await live.accepted(personal_message(live.fake))
    reply = live.live_reply(message)
    await reply.text("Hurry")
    live.fake.expire_stream(reply.handle["stream_id"])
    receipt = await live.teams.channel.send(streamed_reply(message, reply.handle, "Hurry up."))
    [plain] = live.fake.posted
    assert plain.stream_info is None
    assert plain.body["text"] == "Hurry up."
    assert receipt.platform_message_id == "reply-2"


async def test_a_resent_final_posts_nothing_more_in_the_process_or_after_a_restart(
    fake: FakeBotFramework,
) -> None:
    async with live_channel(fake) as before:
        message = await before.accepted(personal_message(fake))
        reply = before.live_reply(message)
        await reply.text("Once")
        outbound = streamed_reply(message, reply.handle, "Once.")
        first = await before.teams.channel.send(outbound)
        again = await before.teams.channel.send(outbound)  # the delivery mark was lost
        requests = len(fake.requests)
    async with live_channel(fake) as after:
        restarted = await after.teams.channel.send(outbound)
    assert len(fake.requests) == requests + 1  # the connector says it is finished: 403
    assert len(fake.finals()) == 1
    assert len(fake.posted) == 1
    assert first == again == restarted


async def test_a_resumed_turn_starts_no_stream_and_its_reply_finishes_the_first(
    fake: FakeBotFramework,
) -> None:
    async with live_channel(fake) as before:
        message = await before.accepted(personal_message(fake))
        reply = before.live_reply(message)
        await reply.status("Thinking…")
        handle = reply.handle
    async with live_channel(fake) as after:
        resumed = after.live_reply(message, resume=handle)
        await resumed.status("Thinking…")
        await resumed.text("Hello again")
        await resumed.close(committed=True)
        assert resumed.handle == handle
        await after.teams.channel.send(streamed_reply(message, resumed.handle, "Hello again."))
    assert len(fake.typing) == 1
    assert len(fake.streams) == 1
    [final] = fake.posted
    assert final.stream_info == {"type": "streaminfo", "streamType": "final", "streamId": "reply-1"}


async def test_a_bot_that_may_not_stream_gets_a_plain_reply(live: LiveHarness) -> None:
    message = await live.accepted(personal_message(live.fake))
    live.fake.refuse_streaming()
    reply = live.live_reply(message)
    with pytest.raises(DeliveryError) as raised:
        await reply.status("Thinking…")
    assert raised.value.permanent
    await reply.text("Hello")  # no more attempts
    assert reply.handle is None
    await live.teams.channel.send(streamed_reply(message, reply.handle, "Hello."))
    [plain] = live.fake.posted
    assert plain.stream_info is None
    assert len(live.fake.requests) == 2


async def test_a_handle_of_another_chat_is_not_finished(live: LiveHarness) -> None:
    message = await live.accepted(personal_message(live.fake))
    foreign = {
        "stream_id": "reply-9",
        "conversation_id": "a:someone-else",
        "started_at": datetime(2025, 6, 1, 12, 0).astimezone().isoformat(),
    }
    await live.teams.channel.send(streamed_reply(message, foreign, "Hello."))
    [plain] = live.fake.posted
    assert plain.stream_info is None
