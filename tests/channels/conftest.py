"""Fixtures for the channel tests: the email channel with an SMTP sink for its replies, and the
Teams channel served against a fake Bot Framework."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from channels.email.adapter import EmailChannel
from tests.channels.email_channel_harness import NOW, Harness, MemoryInbox, SentLog, settings
from tests.channels.teams_channel_harness import ServedChannel, serve_channel
from tests.fakes.bot_framework import FakeBotFramework
from tests.fakes.smtp_sink import SmtpSink


@pytest.fixture
async def make_channel(sink: SmtpSink) -> AsyncIterator[Any]:
    """Start email channels (settings overridden by keyword) relaying to the sink; stops them."""
    started: list[EmailChannel] = []

    async def make(resolver: Any = None, **overrides: Any) -> Harness:
        inbox, sent, rejected = MemoryInbox(), SentLog(), []
        extra = {"resolver": resolver} if resolver is not None else {}
        channel = EmailChannel(
            settings(sink.port, **overrides),
            inbox,
            clock=lambda: NOW,
            sent=sent,
            on_rejected=lambda status, reason: rejected.append((status, reason)),
            **extra,
        )
        await channel.start()
        started.append(channel)
        return Harness(channel, inbox, sent, rejected)

    yield make
    for channel in started:
        await channel.stop()


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotFramework]:
    async with FakeBotFramework() as running:
        yield running


@pytest.fixture
async def teams(fake: FakeBotFramework) -> AsyncIterator[ServedChannel]:
    async with serve_channel(fake) as served:
        yield served
