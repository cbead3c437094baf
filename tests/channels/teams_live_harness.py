"""What the Teams live-reply tests share: a served channel whose wall clock the test moves and
whose chat pace runs on virtual time (so only the pace test waits for real seconds), the
target of a turn as the gateway builds it, and the reply that finishes a stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from channels.base import ChannelMessage, OutboundMessage
from channels.live import LIVE_KEY, LiveReply, ReplyTarget
from channels.teams.connector import ChatPace
from tests.channels.teams_channel_harness import NOW, ServedChannel, reply_to, serve_channel
from tests.fakes.bot_framework import FakeBotFramework


class VirtualTime:
    """Monotonic time that moves only when the pace sleeps on it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class WallClock:
    """The channel's clock (`clock=`), moved by the test."""

    def __init__(self, start: datetime = NOW) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class LiveHarness:
    """A served channel, its clock and its virtual pace time."""

    teams: ServedChannel
    clock: WallClock
    time: VirtualTime

    @property
    def fake(self) -> FakeBotFramework:
        return self.teams.fake

    async def accepted(self, activity: dict[str, Any]) -> ChannelMessage:
        """Post an activity to the channel; the message the inbox accepted."""
        assert (await self.teams.post(activity)).status_code == 200
        return self.teams.inbox.accepted[-1]

    def live_reply(
        self, message: ChannelMessage, resume: Mapping[str, Any] | None = None
    ) -> LiveReply:
        """The channel's live reply for a turn answering `message` (asserted to exist)."""
        reply = self.teams.channel.live_reply(target_of(message), resume=resume)
        assert reply is not None
        return reply


@contextlib.asynccontextmanager
async def live_channel(fake: FakeBotFramework, **overrides: Any) -> AsyncIterator[LiveHarness]:
    """A served Teams channel on a movable clock with a virtual-time chat pace."""
    clock, virtual = WallClock(), VirtualTime()
    pace = ChatPace(1.0, monotonic=virtual.monotonic, sleep=virtual.sleep)
    async with serve_channel(fake, clock=clock, pace=pace, **overrides) as teams:
        yield LiveHarness(teams, clock, virtual)


def target_of(message: ChannelMessage) -> ReplyTarget:
    """The turn's reply target, from the message as the gateway stores it."""
    stored = ChannelMessage.from_record(message.to_record())
    return ReplyTarget(
        channel_id=stored.channel_id,
        thread_id=stored.thread_id,
        reply_context=stored.reply_context,
        user_id="alice",
        user_identifier=stored.user_identifier,
        in_reply_to=stored.message_id,
        conversation=stored.conversation,
    )


def streamed_reply(
    message: ChannelMessage, handle: Mapping[str, Any] | None, content: str
) -> OutboundMessage:
    """The committed reply that finishes the live message `handle` (through JSON, as the
    outbox stores its reply context)."""
    reply = reply_to(message, content)
    context = json.loads(json.dumps({**reply.reply_context, LIVE_KEY: handle}))
    return OutboundMessage(
        message_id=reply.message_id,
        channel_type=reply.channel_type,
        channel_id=reply.channel_id,
        content=reply.content,
        thread_id=reply.thread_id,
        in_reply_to=reply.in_reply_to,
        reply_context=context,
    )
