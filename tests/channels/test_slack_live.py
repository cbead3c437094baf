"""Slack live replies against the fake Slack API over loopback: a real `SlackChannel` streams
an answer (or posts and updates it where Slack refuses streams), and its `send` finishes that
same message with the committed reply: after a retry, a rate limit or a restart too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from channels.base import ChannelType, Conversation, OutboundMessage
from channels.live import LIVE_KEY, LiveChannel, ReplyTarget, TitledChannel
from channels.slack.adapter import SlackChannel, SlackSettings
from channels.slack.live import APPEND_CHARS
from errors import DeliveryError
from tests.channels.slack_doubles import NoThreads
from tests.fakes.slack_api import SIGNING_SECRET, TEAM, FakeSlackAPI, SlackFailure

THREAD = "1700000100.000100"


class Clock:
    """Time the test moves: live replies pace themselves by it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NoInbox:
    async def accept(self, message: Any) -> Any:
        raise AssertionError(f"nothing reaches the inbox here: {message}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


def new_channel(api: FakeSlackAPI, clock: Clock, **fields: Any) -> SlackChannel:
    settings = SlackSettings(
        bot_token="xoxb-test", signing_secret=SIGNING_SECRET, api_base_url=api.url, **fields
    )
    return SlackChannel(settings, NoInbox(), NoThreads(), clock=clock)


@pytest.fixture
def channel(slack_api: FakeSlackAPI, clock: Clock) -> SlackChannel:
    return new_channel(slack_api, clock)


def target(
    channel: str = "C0001",
    thread_ts: str | None = THREAD,
    conversation: Conversation = Conversation.CHANNEL,
    user: str = "U0001",
) -> ReplyTarget:
    context = {"channel": channel, "thread_ts": thread_ts, "team_id": TEAM}
    return ReplyTarget(
        channel_id=channel,
        thread_id=thread_ts or "",
        reply_context=context,
        user_id="alice",
        user_identifier=f"{TEAM}:{user}",
        in_reply_to="Ev1",
        conversation=conversation,
    )


def reply(
    where: ReplyTarget, content: str, handle: Any, reply_id: str = "out-1"
) -> OutboundMessage:
    context = dict(where.reply_context)
    if handle is not None:
        context[LIVE_KEY] = dict(handle)
    return OutboundMessage(
        message_id=reply_id,
        channel_type=ChannelType.SLACK,
        channel_id=where.channel_id,
        content=content,
        thread_id=where.thread_id,
        reply_context=context,
    )


def methods(api: FakeSlackAPI) -> list[str]:
    return [call.method for call in api.calls]


def test_the_slack_channel_is_a_live_and_titled_channel(channel: SlackChannel) -> None:
    assert isinstance(channel, LiveChannel)
    assert isinstance(channel, TitledChannel)
    assert 0.1 <= channel.live_interval <= 1.0


async def test_a_channel_thread_answer_streams_to_its_recipient_and_send_stops_it_with_the_rest(
    channel: SlackChannel, slack_api: FakeSlackAPI, clock: Clock
) -> None:
    where = target()
    live = channel.live_reply(where)
    assert live is not None
    await live.status("is thinking…")
    first = "The report is due on **Friday**"
    await live.text(first)
    clock.now += 1
    more = first + ", and the review " + "goes on " * 10
    await live.text(more)
    await live.close(committed=True)
    final = more + "until Monday."
    receipt = await channel.send(reply(where, final, live.handle))

    (status,) = slack_api.calls_to("assistant.threads.setStatus")
    assert (status.params["channel_id"], status.params["thread_ts"]) == ("C0001", THREAD)
    assert status.params["status"] == "is thinking…"
    (start,) = slack_api.calls_to("chat.startStream")
    assert start.params["thread_ts"] == THREAD
    assert (start.params["recipient_team_id"], start.params["recipient_user_id"]) == (TEAM, "U0001")
    assert start.params["markdown_text"] == first
    (append,) = slack_api.calls_to("chat.appendStream")
    assert append.params["markdown_text"] == more[len(first) :]
    (stop,) = slack_api.calls_to("chat.stopStream")
    assert stop.params["markdown_text"] == "until Monday."
    assert "chat.postMessage" not in methods(slack_api)
    assert "chat.update" not in methods(slack_api)
    (message,) = slack_api.thread("C0001", THREAD)
    assert (message.text, message.streaming) == (final, False)
    assert live.handle == {
        "channel": "C0001",
        "ts": message.ts,
        "mode": "stream",
        "thread_ts": THREAD,
    }
    assert receipt.platform_message_id == message.ts


async def test_where_slack_refuses_streams_the_answer_is_posted_once_then_updated(
    channel: SlackChannel, slack_api: FakeSlackAPI, clock: Clock
) -> None:
    slack_api.refuse["chat.startStream"] = "not_allowed"
    where = target()
    live = channel.live_reply(where)
    assert live is not None
    await live.text("Checking")
    clock.now += 1
    await live.text("Checking the **calendar**")
    await channel.send(reply(where, "Checking the **calendar**: free on Friday.", live.handle))
    second = channel.live_reply(target(thread_ts="1700000200.000200"))
    assert second is not None
    await second.text("Another answer")

    assert methods(slack_api).count("chat.startStream") == 1  # the refusal is remembered
    (message,) = slack_api.thread("C0001", THREAD)
    assert message.created_by == "chat.postMessage"
    assert message.text == "Checking the *calendar*: free on Friday."
    assert [call.params["text"] for call in slack_api.calls_to("chat.update")] == [
        "Checking the *calendar*",
        "Checking the *calendar*: free on Friday.",
    ]
    assert live.handle is not None
    assert live.handle["mode"] == "update"


async def test_a_top_level_dm_message_gets_a_top_level_message_and_no_thread_status(
    channel: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    where = target("D0001", None, Conversation.DIRECT)
    live = channel.live_reply(where)
    assert live is not None
    await live.status("is thinking…")
    await live.text("Hello")
    await live.close(committed=True)
    await channel.send(reply(where, "Hello there", live.handle))

    assert methods(slack_api) == ["chat.postMessage", "chat.update"]
    (message,) = slack_api.thread("D0001", None)
    assert message.text == "Hello there"


async def test_a_committed_text_that_differs_from_the_stream_replaces_it(
    channel: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    where = target()
    live = channel.live_reply(where)
    assert live is not None
    await live.text("A first draft of the answer")
    await channel.send(reply(where, "The final answer", live.handle))

    assert methods(slack_api) == ["chat.startStream", "chat.stopStream", "chat.update"]
    assert "markdown_text" not in slack_api.calls_to("chat.stopStream")[0].params
    (message,) = slack_api.thread("C0001", THREAD)
    assert (message.text, message.streaming) == ("The final answer", False)


async def test_after_a_restart_the_handle_alone_finishes_the_message_and_a_retry_changes_nothing(
    channel: SlackChannel, slack_api: FakeSlackAPI, clock: Clock
) -> None:
    where = target()
    live = channel.live_reply(where)
    assert live is not None
    await live.text("Half of the ans")
    handle = live.handle
    restarted = new_channel(slack_api, clock)
    final = "Half of the answer, and the other half."
    await restarted.send(reply(where, final, handle))
    await new_channel(slack_api, clock).send(reply(where, final, handle))  # retried elsewhere

    assert methods(slack_api) == [
        "chat.startStream",
        "chat.stopStream",
        "chat.update",
        "chat.stopStream",  # refused: no longer streaming
        "chat.update",
    ]
    (message,) = slack_api.thread("C0001", THREAD)
    assert (message.text, message.streaming) == (final, False)


async def test_a_resumed_answer_shows_status_but_never_creates_a_message(
    channel: SlackChannel, slack_api: FakeSlackAPI, clock: Clock
) -> None:
    where = target()
    first = channel.live_reply(where)
    assert first is not None
    await first.text("Before the crash")
    handle = first.handle
    assert handle is not None
    restarted = new_channel(slack_api, clock)
    resumed = restarted.live_reply(where, resume=handle)
    assert resumed is not None
    await resumed.status("is thinking…")
    await resumed.text("Before the crash, and after")
    clock.now += 5
    await resumed.text("Before the crash, and after it")
    await resumed.close(committed=True)
    await restarted.send(reply(where, "Before the crash, and after it.", resumed.handle))

    assert resumed.handle == handle
    assert methods(slack_api).count("chat.startStream") == 1
    assert "chat.postMessage" not in methods(slack_api)
    assert "chat.appendStream" not in methods(slack_api)
    (message,) = slack_api.thread("C0001", THREAD)
    assert message.text == "Before the crash, and after it."


async def test_a_long_answer_fills_the_live_message_and_follows_up_in_the_thread_once(
    channel: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    where = target()
    live = channel.live_reply(where)
    assert live is not None
    paragraphs = [f"**Part {n}**\n" + "word " * 700 for n in range(3)]
    content = "\n\n".join(paragraphs)
    await live.text(content[:100])
    outbound = reply(where, content, live.handle)
    slack_api.fail("chat.postMessage", SlackFailure(429, "ratelimited", "2"))
    with pytest.raises(DeliveryError) as failure:
        await channel.send(outbound)
    assert failure.value.retry_after == 2.0
    await channel.send(outbound)

    assert methods(slack_api).count("chat.stopStream") == 1
    messages = slack_api.thread("C0001", THREAD)
    assert len(messages) == 3  # the live message and two follow-ups, each once
    assert messages[0].text.startswith("**Part 0**")
    assert [m.text.split("\n")[0] for m in messages[1:]] == ["*Part 1*", "*Part 2*"]
    assert all(len(m.text) <= 3900 for m in messages)


async def test_a_rate_limit_mid_stream_pauses_the_live_text_and_send_still_completes_it(
    channel: SlackChannel, slack_api: FakeSlackAPI, clock: Clock
) -> None:
    where = target()
    live = channel.live_reply(where)
    assert live is not None
    await live.text("One")
    slack_api.fail("chat.appendStream", SlackFailure(429, "ratelimited", "3"))
    clock.now += 1
    with pytest.raises(DeliveryError) as failure:
        await live.text("One, two" + "." * APPEND_CHARS)
    assert failure.value.retry_after == 3.0
    await live.close(committed=True)
    final = "One, two, three."
    await channel.send(reply(where, final, live.handle))

    (message,) = slack_api.thread("C0001", THREAD)
    assert (message.text, message.streaming) == (final, False)
    assert slack_api.calls_to("chat.stopStream")[-1].params["markdown_text"] == ", two, three."


async def test_a_status_slack_refuses_is_not_asked_again_for_that_answer(
    channel: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    slack_api.refuse["assistant.threads.setStatus"] = "not_allowed"
    live = channel.live_reply(target())
    assert live is not None
    await live.status("is thinking…")
    await live.status("is searching earlier conversations…")
    await live.close(committed=False)
    assert methods(slack_api) == ["assistant.threads.setStatus"]


async def test_a_status_shown_after_the_message_exists_is_cleared_on_close(
    channel: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    live = channel.live_reply(target())
    assert live is not None
    await live.text("Let me look that up.")
    await live.status("is using a tool…")
    await live.close(committed=True)
    statuses = [c.params["status"] for c in slack_api.calls_to("assistant.threads.setStatus")]
    assert statuses == ["is using a tool…", ""]


async def test_with_streaming_off_there_is_no_live_reply(
    slack_api: FakeSlackAPI, clock: Clock
) -> None:
    channel = new_channel(slack_api, clock, streaming=False)
    assert channel.live_reply(target()) is None


async def test_an_answer_costs_about_one_call_a_second_and_appends_only_enough_new_text(
    channel: SlackChannel, slack_api: FakeSlackAPI, clock: Clock
) -> None:
    live = channel.live_reply(target())
    assert live is not None
    text = ""
    for second in range(30):  # the gateway offers the text once a second
        text += "word " * (3 if second % 2 else 20)  # 15 or 100 new characters
        await live.text(text)
        clock.now += channel.live_interval
    calls = slack_api.calls_to("chat.startStream", "chat.appendStream")
    assert len(calls) <= 16  # the offers with little new text wait for the next one
    assert all(len(c.params["markdown_text"]) >= APPEND_CHARS for c in calls[1:])
    shown = slack_api.messages[calls[0].params["ts"]].text
    assert text.startswith(shown)
    assert len(text) - len(shown) < APPEND_CHARS


async def test_fifty_answers_at_once_stay_within_slacks_limits_and_all_finish(
    slack_api: FakeSlackAPI, clock: Clock
) -> None:
    slack_api.limit_tiers()
    channel = new_channel(slack_api, clock)
    places = [
        target(f"D{n:04d}", f"17000001{n:02d}.000100", Conversation.DIRECT, f"U{n:04d}")
        for n in range(50)
    ]
    lives = [channel.live_reply(place) for place in places]
    assert all(live is not None for live in lives)
    texts = [""] * 50
    for _second in range(20):
        for n in range(50):
            texts[n] += f"sentence {_second} of answer {n}. " * 3
        await asyncio.gather(*(live.text(texts[n]) for n, live in enumerate(lives) if live))
        clock.now += channel.live_interval
    live_calls = len(slack_api.calls)
    assert sum(slack_api.rate_limited.values()) == 0
    assert live_calls <= 50 + 100 * 20 / 60 + 100 / 6 + 50 * 20 / 60 + 50 / 6

    slack_api.rate_limits.clear()  # the outbox retries finals Slack rate-limits
    for n, live in enumerate(lives):
        assert live is not None
        await channel.send(reply(places[n], texts[n] + "Done.", live.handle, f"out-{n}"))
    for place in places:
        (message,) = slack_api.thread(place.channel_id, place.thread_id)
        assert message.text.endswith("Done.")
        assert not message.streaming


async def test_fifty_top_level_dm_answers_keep_an_edit_for_every_final_or_are_posted_whole(
    slack_api: FakeSlackAPI, clock: Clock
) -> None:
    slack_api.limit_tiers()
    channel = new_channel(slack_api, clock)
    places = [target(f"D{n:04d}", None, Conversation.DIRECT, f"U{n:04d}") for n in range(50)]
    lives = [channel.live_reply(place) for place in places]
    texts = [""] * 50
    for second in range(20):
        for n in range(50):
            texts[n] += f"sentence {second} of answer {n}. " * 3
        await asyncio.gather(*(live.text(texts[n]) for n, live in enumerate(lives) if live))
        clock.now += channel.live_interval
    edited = sum(1 for live in lives if live is not None and live.handle is not None)
    assert 0 < edited < 50  # the budget had edits for some finals only
    for n, live in enumerate(lives):
        assert live is not None
        await channel.send(reply(places[n], texts[n] + "Done.", live.handle, f"out-{n}"))
    assert sum(slack_api.rate_limited.values()) == 0  # finals included
    for place in places:
        (message,) = slack_api.thread(place.channel_id, None)
        assert message.text.endswith("Done.")
