"""Live replies on the web channel: the event stream over a real socket against a real
`WebChannel` (status, text and message events, replies committed elsewhere, resuming, auth,
limits, heartbeats, the end of a stream), and the hub's behaviour with slow consumers."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from channels.live import LiveChannel
from channels.web.events import StreamTiming, coalesce, sse
from channels.web.live import LiveEvent, LiveHub, Subscription, TooManyStreamsError
from tests.channels.web_channel_harness import (
    TOKEN,
    Event,
    ServedWeb,
    open_stream,
    serve_web,
    settings,
)


@pytest.fixture
async def web() -> ServedWeb:  # type: ignore[misc]
    async with serve_web() as served:
        yield served


async def streams_of(web: ServedWeb, user: str, count: int) -> None:
    """Until the channel has `count` open streams of `user` (a disconnect is noticed by the
    server asynchronously)."""
    async with asyncio.timeout(5):
        while web.channel.hub.streams(user) != count:
            await asyncio.sleep(0.01)


# --- the stream ------------------------------------------------------------------------------


async def test_a_live_answer_streams_status_and_text_then_its_message(web: ServedWeb) -> None:
    assert isinstance(web.channel, LiveChannel)
    assert web.channel.live_interval <= 0.2
    live = web.channel.live_reply(web.target("alice", "m-1"))
    assert live is not None
    assert live.handle is None  # the web reply is stored delivered: nothing to finish
    async with open_stream(web.client) as events:
        await streams_of(web, "alice", 1)
        await live.status("Thinking…")
        assert await events.next() == _event("status", {"in_reply_to": "m-1", "text": "Thinking…"})
        await live.text("Hello")
        assert await events.next() == _event("text", {"in_reply_to": "m-1", "text": "Hello"})
        await live.text("Hello there")
        assert await events.next() == _event("text", {"in_reply_to": "m-1", "text": "Hello there"})
        item = web.feed.commit("alice", "Hello there, Alice.", in_reply_to="m-1")
        await live.close(committed=True)
        message = await events.next()
    assert message.name == "message"
    assert message.data == item  # exactly the JSON feed's item
    assert message.id == "1"  # the feed's cursor


async def test_the_final_message_is_read_at_once_when_the_live_reply_closes() -> None:
    # Polling would take a minute here: only the wake makes the message arrive in time.
    slow = StreamTiming(poll_interval=60, heartbeat_interval=60, max_seconds=120)
    async with serve_web(timing=slow) as web:
        live = web.channel.live_reply(web.target("alice", "m-1"))
        assert live is not None
        async with open_stream(web.client) as events:
            await streams_of(web, "alice", 1)
            web.feed.commit("alice", "done", in_reply_to="m-1")
            async with asyncio.timeout(5):
                await live.close(committed=True)
                message = await events.next()
    assert (message.name, message.data["text"]) == ("message", "done")


async def test_a_reply_committed_elsewhere_arrives_without_a_live_reply(web: ServedWeb) -> None:
    async with open_stream(web.client) as events:
        await streams_of(web, "alice", 1)
        # Another process committed it: nothing here wakes the stream but its poll.
        item = web.feed.commit("alice", "from another process", in_reply_to="m-9")
        async with asyncio.timeout(5):
            message = await events.next()
    assert message == _event("message", item, "1")


async def test_the_stream_starts_after_the_cursor_and_resumes_from_the_last_event_id(
    web: ServedWeb,
) -> None:
    for number in range(1, 4):
        web.feed.commit("alice", f"reply {number}")
    web.feed.commit("bob", "not for alice")
    async with open_stream(web.client, {"user": "alice", "after": "1"}) as events:
        first, second = await events.next(), await events.next()
    # Several replies at once still carry each one's own cursor.
    assert [(first.data["text"], first.id), (second.data["text"], second.id)] == [
        ("reply 2", "2"),
        ("reply 3", "3"),
    ]
    web.feed.commit("alice", "reply 5")
    async with open_stream(web.client, headers={"last-event-id": "2"}) as events:
        third, fifth = await events.next(), await events.next()
    assert [(third.data["text"], third.id), (fifth.data["text"], fifth.id)] == [
        ("reply 3", "3"),
        ("reply 5", "5"),
    ]


async def test_status_and_text_go_only_to_that_users_streams(web: ServedWeb) -> None:
    for_bob = web.channel.live_reply(web.target("bob", "b-1"))
    for_alice = web.channel.live_reply(web.target("alice", "a-1"))
    assert for_bob is not None
    assert for_alice is not None
    async with open_stream(web.client) as events:
        await streams_of(web, "alice", 1)
        await for_bob.status("Thinking…")
        await for_alice.status("Searching earlier conversations…")
        event = await events.next()
    assert event.data == {"in_reply_to": "a-1", "text": "Searching earlier conversations…"}


async def test_an_answer_without_a_reply_ends_with_done(web: ServedWeb) -> None:
    live = web.channel.live_reply(web.target("alice", "m-1"))
    assert live is not None
    async with open_stream(web.client) as events:
        await streams_of(web, "alice", 1)
        await live.status("Thinking…")
        await live.close(committed=False)
        seen = await events.until("done")
    assert seen[-1].data == {"in_reply_to": "m-1", "committed": False}


async def test_no_live_text_is_sent_for_an_answer_whose_message_was_sent(web: ServedWeb) -> None:
    live = web.channel.live_reply(web.target("alice", "m-1"))
    assert live is not None
    async with open_stream(web.client) as events:
        await streams_of(web, "alice", 1)
        web.feed.commit("alice", "final", in_reply_to="m-1")
        await events.until("message")
        await live.text("a late preview")  # would replace the final message on the page
        web.feed.commit("alice", "next", in_reply_to="m-2")
        following = await events.next()
    assert (following.name, following.data["text"]) == ("message", "next")


async def test_the_json_feed_is_unchanged_beside_the_stream(web: ServedWeb) -> None:
    item = web.feed.commit("alice", "hello", in_reply_to="m-1")
    for accept in (None, "application/json", "*/*"):
        headers = {"accept": accept} if accept else {}
        response = await web.client.get(
            "/web/v1/messages", params={"user": "alice"}, headers=headers
        )
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {"messages": [item], "cursor": "1"}


async def test_a_heartbeat_keeps_an_idle_stream_open() -> None:
    timing = StreamTiming(poll_interval=0.05, heartbeat_interval=0.1, max_seconds=60)
    async with serve_web(timing=timing) as web, open_stream(web.client) as events:
        comment = await events.next(comments=True)
    assert (comment.name, comment.data) == (":", "keep-alive")


async def test_a_stream_ends_by_itself_and_when_the_channel_stops() -> None:
    timing = StreamTiming(poll_interval=0.05, heartbeat_interval=10, max_seconds=0.3)
    async with serve_web(timing=timing) as web:
        async with asyncio.timeout(5), open_stream(web.client) as events:
            with pytest.raises(EOFError):
                await events.next()
        async with serve_web() as other, open_stream(other.client) as events:
            await streams_of(other, "alice", 1)
            await other.channel.stop()
            with pytest.raises(EOFError):
                await events.next()


async def test_too_many_streams_of_one_user_get_429_until_one_closes() -> None:
    async with serve_web(hub=LiveHub(max_streams_per_user=2)) as web:
        async with open_stream(web.client), open_stream(web.client):
            refused = await web.client.get(
                "/web/v1/messages",
                params={"user": "alice"},
                headers={"accept": "text/event-stream"},
            )
            async with open_stream(web.client, {"user": "bob"}):
                await streams_of(web, "bob", 1)  # other users are not affected
        await streams_of(web, "alice", 0)  # both disconnected: the streams were released
        async with open_stream(web.client):
            await streams_of(web, "alice", 1)
    assert refused.status_code == 429
    assert "at most 2 event streams" in refused.json()["error"]
    assert web.rejections[-1][0] == 429


@pytest.mark.parametrize(
    ("headers", "params", "status", "reason"),
    [
        ({}, {"user": "alice"}, 401, "missing bearer token"),
        ({"authorization": "Bearer nope-nope-nope"}, {}, 401, "unknown token"),
        ({"authorization": "Basic x"}, {}, 401, "Bearer <token>"),
        ({"authorization": f"Bearer {TOKEN}"}, {"user": "bob"}, 403, "another user"),
        ({"authorization": f"Bearer {TOKEN}"}, {"after": "x"}, 400, "'after'"),
    ],
    ids=["no-token", "unknown-token", "not-bearer", "other-user", "bad-cursor"],
)
async def test_a_stream_is_refused_as_the_feed_is(
    headers: dict[str, str], params: dict[str, str], status: int, reason: str
) -> None:
    async with serve_web(dev_open=False) as web:
        response = await web.client.get(
            "/web/v1/messages", params=params, headers={"accept": "text/event-stream", **headers}
        )
        assert web.channel.hub.streams("alice") == 0
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert reason in response.json()["error"]
    assert web.rejections == [(status, response.json()["error"])]


async def test_with_a_token_the_stream_is_the_tokens_users() -> None:
    async with serve_web(dev_open=False) as web:
        web.feed.commit("alice", "for alice")
        auth = {"authorization": f"Bearer {TOKEN}"}
        async with open_stream(web.client, {}, auth) as events:
            message = await events.next()
    assert message.data["text"] == "for alice"


async def test_with_streaming_off_there_is_no_live_reply_and_a_reload_turns_it_on(
    web: ServedWeb,
) -> None:
    web.channel.reconfigure(settings(streaming=False))
    assert web.channel.live_reply(web.target("alice", "m-1")) is None
    web.channel.reconfigure(settings(streaming=True))
    assert web.channel.live_reply(web.target("alice", "m-1")) is not None


async def test_the_live_reply_is_keyed_by_the_web_id_not_the_gateway_user(
    web: ServedWeb,
) -> None:
    target = web.target("carol", "m-7")
    assert target.user_id != target.channel_id
    live = web.channel.live_reply(target)
    assert live is not None
    async with open_stream(web.client, {"user": "carol"}) as events:
        await streams_of(web, "carol", 1)
        await live.status("Thinking…")
        event = await events.next()
    assert event.data["in_reply_to"] == "m-7"


# --- the hub and the event format ------------------------------------------------------------


async def test_a_slow_consumer_keeps_only_the_newest_live_events() -> None:
    hub = LiveHub(capacity=3)
    subscription = hub.subscribe("alice")
    for length in range(1, 11):
        hub.publish("alice", LiveEvent("text", "m-1", "x" * length))
    changed, events = subscription.take()
    assert changed  # a new stream reads the feed first
    assert [len(event.text) for event in events] == [8, 9, 10]
    assert subscription.dropped == 7
    hub.wake("alice")
    assert subscription.take() == (True, [])
    hub.unsubscribe("alice", subscription)
    assert hub.streams("alice") == 0


async def test_the_hub_limits_streams_per_user_and_closing_ends_them_all() -> None:
    hub = LiveHub(max_streams_per_user=1)
    first = hub.subscribe("alice")
    with pytest.raises(TooManyStreamsError):
        hub.subscribe("alice")
    other = hub.subscribe("bob")
    hub.close()
    later = hub.subscribe("carol")
    assert [first.closed, other.closed, later.closed] == [True, True, True]


async def test_a_subscription_wait_returns_on_an_event_or_after_its_time() -> None:
    subscription = Subscription(4)
    subscription.take()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await subscription.wait(0.05)
    assert loop.time() - started >= 0.04
    loop.call_soon(subscription.push, LiveEvent("status", "m-1", "Thinking…"))
    async with asyncio.timeout(5):
        await subscription.wait(60)
    assert subscription.take()[1] == [LiveEvent("status", "m-1", "Thinking…")]


def test_only_the_last_text_of_an_answer_is_sent_and_none_after_its_message() -> None:
    events = [
        LiveEvent("status", "m-1", "Thinking…"),
        LiveEvent("text", "m-1", "He"),
        LiveEvent("text", "m-2", "Other"),
        LiveEvent("text", "m-1", "Hello"),
        LiveEvent("text", "m-3", "late"),
        LiveEvent("done", "m-3", committed=True),
    ]
    kept = coalesce(events, deque(["m-3"]))
    assert kept == [events[0], events[2], events[3]]


def test_an_event_is_one_line_of_json_with_its_id() -> None:
    assert sse("message", {"text": "two\nlines é"}, event_id="7") == (
        'event: message\nid: 7\ndata: {"text":"two\\nlines é"}\n\n'.encode()
    )
    assert sse("status", {"text": "x"}) == b'event: status\ndata: {"text":"x"}\n\n'


def _event(name: str, data: object, event_id: str | None = None) -> Event:
    return Event(name, data, event_id)
