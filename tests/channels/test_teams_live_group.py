"""Live replies where Teams cannot stream (channels, group chats): a typing indicator while
the turn runs and the answer as one message; the real pace of one request a second per chat;
and the `channels.teams.streaming` switch."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from channels.teams.config import TeamsChannelConfig
from channels.teams.live import TYPING_EVERY, TeamsTypingReply
from channels.teams.plugin import PLUGIN, settings_of
from tests.channels.teams_activities import TEAM_CHANNEL, channel_mention, personal_message
from tests.channels.teams_channel_harness import reply_to, serve_channel
from tests.channels.teams_live_harness import (
    LiveHarness,
    live_channel,
    streamed_reply,
    target_of,
)
from tests.fakes.bot_framework import FakeBotFramework


@pytest.fixture
async def live(fake: FakeBotFramework) -> AsyncIterator[LiveHarness]:
    async with live_channel(fake) as harness:
        yield harness


def group_chat_message(fake: FakeBotFramework) -> dict[str, object]:
    """A mention of the bot in a group chat (no reply chains there)."""
    activity = channel_mention(fake)
    activity["conversation"] = {
        "id": "19:group-chat@thread.v2",
        "conversationType": "groupChat",
        "isGroup": True,
    }
    del activity["replyToId"]
    return activity


async def test_a_channel_thread_shows_typing_and_gets_its_answer_as_one_message(
    fake: FakeBotFramework,
) -> None:
    async with serve_channel(fake) as teams:  # the real pace and keep-alive timing
        assert (await teams.post(channel_mention(fake, root="1717243100000"))).status_code == 200
        message = teams.inbox.accepted[-1]
        reply = teams.channel.live_reply(target_of(message))
        assert isinstance(reply, TeamsTypingReply)
        await reply.status("Thinking…")
        await reply.status("Searching earlier conversations…")  # within 3 s: shown already
        await reply.text("The status is")
        assert reply.handle is None
        await reply.close(committed=True)
        assert not reply.typing_repeats
        await teams.channel.send(reply_to(message, "All green."))
    [typing] = fake.typing
    assert typing.body["type"] == "typing"
    assert typing.stream_info is None
    assert typing.conversation_id == f"{TEAM_CHANNEL};messageid=1717243100000"
    [answer] = fake.posted
    assert answer.stream_info is None
    assert answer.body["text"] == "All green."
    # Sent right after the typing indicator, the answer still keeps to the chat's pace.
    assert fake.too_fast() == []


async def test_the_typing_indicator_is_repeated_while_the_turn_runs(
    fake: FakeBotFramework,
) -> None:
    async with serve_channel(fake) as teams:
        assert (await teams.post(group_chat_message(fake))).status_code == 200
        reply = teams.channel.live_reply(target_of(teams.inbox.accepted[-1]))
        assert reply is not None
        started = time.monotonic()
        await reply.status("Thinking…")
        await fake.wait_for(lambda: len(fake.typing) == 2, timeout=TYPING_EVERY + 5)
        await reply.close(committed=True)
        assert isinstance(reply, TeamsTypingReply)
        assert not reply.typing_repeats
    assert fake.typing[1].received_at - started >= TYPING_EVERY
    assert {post.conversation_id for post in fake.typing} == {"19:group-chat@thread.v2"}
    assert fake.posted == []


async def test_a_stream_never_sends_two_requests_to_a_chat_within_a_second(
    fake: FakeBotFramework,
) -> None:
    async with serve_channel(fake) as teams:  # the real pace, on real time
        assert (await teams.post(personal_message(fake))).status_code == 200
        message = teams.inbox.accepted[-1]
        reply = teams.channel.live_reply(target_of(message))
        assert reply is not None
        await reply.status("Thinking…")
        await reply.text("A")
        await reply.text("A b")
        await teams.channel.send(streamed_reply(message, reply.handle, "A b c."))
    assert len(fake.typing) == 3
    assert len(fake.finals()) == 1
    assert fake.too_fast() == []
    assert fake.stream_errors == []


async def test_with_streaming_off_there_is_no_live_reply_until_a_reload_turns_it_on(
    fake: FakeBotFramework,
) -> None:
    async with live_channel(fake, streaming=False) as live:
        message = await live.accepted(personal_message(fake))
        channel = live.teams.channel
        assert channel.live_reply(target_of(message)) is None
        channel.reconfigure(settings_of(TeamsChannelConfig(streaming=True)))
        assert channel.live_reply(target_of(message)) is not None


async def test_a_resumed_stream_is_finished_even_with_streaming_off(
    fake: FakeBotFramework,
) -> None:
    async with live_channel(fake) as live:
        message = await live.accepted(personal_message(fake))
        reply = live.live_reply(message)
        await reply.text("Half")
        handle = reply.handle
        live.teams.channel.reconfigure(
            settings_of(
                TeamsChannelConfig(
                    app_id=live.teams.channel.settings.app_id,
                    app_password=live.teams.channel.settings.app_password,
                    streaming=False,
                )
            )
        )
        resumed = live.teams.channel.live_reply(target_of(message), resume=handle)
        assert resumed is not None
        assert resumed.handle == handle
        await live.teams.channel.send(streamed_reply(message, handle, "Half done."))
    assert [post.body["text"] for post in fake.finals()] == ["Half done."]


def test_streaming_is_on_by_default_and_reloadable() -> None:
    assert TeamsChannelConfig().streaming is True
    assert settings_of(TeamsChannelConfig()).streaming is True
    assert "streaming" in PLUGIN.reloadable


async def test_a_message_without_a_conversation_reference_gets_no_live_reply(
    live: LiveHarness,
) -> None:
    message = await live.accepted(personal_message(live.fake))
    target = target_of(message)
    bare = type(target)(
        channel_id=target.channel_id,
        thread_id="",
        reply_context={},
        user_id=target.user_id,
        user_identifier=target.user_identifier,
        in_reply_to=target.in_reply_to,
    )
    assert live.teams.channel.live_reply(bare) is None
