"""The Teams channel's routes served by a real uvicorn on a free loopback port, with a recording
inbox; replies built from accepted messages as the gateway stores them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from channels.base import AcceptResult, ChannelMessage, ChannelType, OutboundMessage
from channels.teams.adapter import TeamsChannel, TeamsSettings
from channels.teams.connector import ChatPace
from errors import StorageError
from tests.channels.teams_activities import TENANT
from tests.fakes.bot_framework import (
    APP_ID,
    APP_PASSWORD,
    FakeBotFramework,
    free_port,
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


class RecordingInbox:
    """An InboxPort that keeps what it accepted; duplicates (same message id) are recognised."""

    def __init__(self) -> None:
        self.accepted: list[ChannelMessage] = []
        self.calls = 0
        self.failure: StorageError | None = None

    async def accept(self, message: ChannelMessage) -> AcceptResult:
        self.calls += 1
        if self.failure is not None:
            raise self.failure
        duplicate = any(seen.message_id == message.message_id for seen in self.accepted)
        if not duplicate:
            self.accepted.append(message)
        return AcceptResult(accepted=not duplicate, message_id=message.message_id)


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class ServedChannel:
    """A served channel, its inbox, the fake it talks to and a client for its routes."""

    channel: TeamsChannel
    inbox: RecordingInbox
    fake: FakeBotFramework
    client: httpx.AsyncClient
    rejections: list[tuple[int, str]] = field(default_factory=list)

    async def post(
        self, activity: dict[str, Any], headers: dict[str, str] | None = None
    ) -> httpx.Response:
        headers = self.fake.bearer() if headers is None else headers
        return await self.client.post("/api/messages", json=activity, headers=headers)


@contextlib.asynccontextmanager
async def serve_channel(
    fake: FakeBotFramework,
    *,
    clock: Callable[[], datetime] = lambda: NOW,
    pace: ChatPace | None = None,
    **overrides: Any,
) -> AsyncIterator[ServedChannel]:
    """The channel's routes in a Starlette app on a free loopback port (settings overridden
    by keyword; `clock` and `pace` as the channel takes them)."""
    settings = TeamsSettings(
        **{
            "app_id": APP_ID,
            "app_password": APP_PASSWORD,
            "tenant_ids": (TENANT,),
            "openid_metadata_url": fake.openid_metadata_url,
            "oauth_token_url": fake.token_url,
            **overrides,
        }
    )
    inbox = RecordingInbox()
    rejections: list[tuple[int, str]] = []
    channel = TeamsChannel(
        settings,
        inbox,
        clock=clock,
        on_rejected=lambda status, reason: rejections.append((status, reason)),
        pace=pace,
    )
    port = free_port()
    server = _QuietServer(
        uvicorn.Config(
            Starlette(routes=channel.routes()),
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            serving.result()
        await asyncio.sleep(0.01)
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10)
    try:
        yield ServedChannel(channel, inbox, fake, client, rejections)
    finally:
        await client.aclose()
        server.should_exit = True
        await serving
        await channel.stop()


def reply_to(message: ChannelMessage, content: str = "**Done.**") -> OutboundMessage:
    """The reply the gateway would send to the message."""
    # Through to_record/from_record, as the gateway stores it: the reply survives restarts.
    stored = ChannelMessage.from_record(message.to_record())
    return OutboundMessage(
        message_id="out-1",
        channel_type=ChannelType.TEAMS,
        channel_id=stored.channel_id,
        content=content,
        thread_id=stored.thread_id,
        in_reply_to=stored.message_id,
        reply_context=stored.reply_context,
    )
