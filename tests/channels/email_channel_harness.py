"""An `EmailChannel` started on a free loopback port, with an in-memory inbox and log of the
replies sent, as the gateway's inbox and outbox would be."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from channels.base import AcceptResult, ChannelMessage
from channels.email.adapter import EmailChannel, EmailSettings
from tests.channels.email_mail import ASSISTANT

NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)


@dataclass
class MemoryInbox:
    """Commits in memory, dedupes on message id, or fails as told."""

    messages: list[ChannelMessage] = field(default_factory=list)
    failure: Exception | None = None

    async def accept(self, message: ChannelMessage) -> AcceptResult:
        if self.failure is not None:
            raise self.failure
        duplicate = any(seen.message_id == message.message_id for seen in self.messages)
        if not duplicate:
            self.messages.append(message)
        return AcceptResult(accepted=not duplicate, message_id=message.message_id)


@dataclass
class SentLog:
    """Our replies by id, as the gateway's outbox would answer."""

    texts_by_id: dict[str, str] = field(default_factory=dict)
    asked: list[list[str]] = field(default_factory=list)

    async def texts(self, message_ids: Sequence[str]) -> list[str]:
        self.asked.append(list(message_ids))
        return [self.texts_by_id[i] for i in message_ids if i in self.texts_by_id]


def settings(sink_port: int = 9, **overrides: Any) -> EmailSettings:
    """Settings for a channel on loopback that relays its replies to `sink_port`."""
    values: dict[str, Any] = {
        "addresses": (ASSISTANT,),
        "listen_host": "127.0.0.1",
        "listen_port": 0,
        "max_message_bytes": 200_000,
        "auth_mode": "off",
        "trusted_authserv_id": None,
        "outbound_host": "127.0.0.1",
        "outbound_port": sink_port,
        "outbound_starttls": False,
        "outbound_username": "",
        "outbound_password": "",
    }
    values.update(overrides)
    return EmailSettings(**values)


@dataclass
class Harness:
    """A started channel and what it hands over or refuses."""

    channel: EmailChannel
    inbox: MemoryInbox
    sent: SentLog
    rejected: list[tuple[int, str]]
