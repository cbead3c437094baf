"""The web channel's routes served by a real uvicorn on a free loopback port, over an in-memory
reply feed, history and file stash (a reply "committed" by adding it to the feed, as another
process would), and a reader of server-sent events for the streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from channels.base import AcceptResult, ChannelMessage
from channels.files import FileLimits
from channels.live import ReplyTarget
from channels.web.adapter import WebChannel, WebSettings
from channels.web.events import StreamTiming
from channels.web.live import LiveHub
from errors import StorageError
from tests.e2e.harness import free_port

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
TOKEN = "t-alice-123456"


class MemoryInbox:
    """An InboxPort that keeps what it accepted; a repeated message id is a duplicate."""

    def __init__(self) -> None:
        self.accepted: list[ChannelMessage] = []

    async def accept(self, message: ChannelMessage) -> AcceptResult:
        duplicate = any(seen.message_id == message.message_id for seen in self.accepted)
        if not duplicate:
            self.accepted.append(message)
        return AcceptResult(accepted=not duplicate, message_id=message.message_id)


class MemoryStash:
    """A FileStash in memory; `failing_after` puts succeed, then it raises `StorageError`."""

    def __init__(self, failing_after: int | None = None) -> None:
        self.kept: dict[str, bytes] = {}
        self.puts = 0
        self.failing_after = failing_after

    async def put(self, data: bytes) -> str:
        if self.failing_after is not None and self.puts >= self.failing_after:
            raise StorageError("the store is down")
        self.puts += 1
        key = f"k{self.puts}"
        self.kept[key] = data
        return key

    async def discard(self, key: str) -> None:
        self.kept.pop(key, None)


class MemoryFeed:
    """The reply feed kept in memory: cursors are positions, replies per web user."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, dict[str, Any]]] = []
        self.reads = 0

    def commit(self, user: str, text: str, *, in_reply_to: str | None = None) -> dict[str, Any]:
        """Store a reply to `user` (the feed item), as a turn's commit would."""
        cursor = len(self.rows) + 1
        item = {
            "message_id": f"r-{cursor}",
            "role": "assistant",
            "text": text,
            "session_id": "s-1",
            "thread_id": None,
            "in_reply_to": in_reply_to,
            "created_at": (NOW + timedelta(seconds=cursor)).isoformat(),
        }
        self.rows.append((cursor, user, item))
        return item

    async def replies(
        self, user_id: str, *, after: int, limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        self.reads += 1
        rows = [(cursor, item) for cursor, user, item in self.rows if user == user_id]
        page = [(cursor, item) for cursor, item in rows if cursor > after][:limit]
        return [item for _, item in page], (page[-1][0] if page else after)


@dataclass
class MemoryHistory:
    """The history kept in memory: what the page shows first, and the feed's cursor."""

    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    cursor: int = 0

    async def history(self, channel_id: str, *, limit: int) -> tuple[list[dict[str, Any]], int]:
        return self.messages.get(channel_id, [])[-limit:], self.cursor


class NoExports:
    async def export(self, token: str) -> dict[str, Any] | None:
        return None


@dataclass
class ServedWeb:
    """A served web channel, its in-memory services and a client for its routes."""

    channel: WebChannel
    inbox: MemoryInbox
    feed: MemoryFeed
    history: MemoryHistory
    stash: MemoryStash | None
    client: httpx.AsyncClient
    base_url: str
    rejections: list[tuple[int, str]] = field(default_factory=list)

    def target(self, user: str, client_message_id: str) -> ReplyTarget:
        """The reply address of a web message, as the gateway builds it."""
        return ReplyTarget(
            channel_id=user,
            thread_id="",
            reply_context={"client_message_id": client_message_id},
            user_id=f"gateway-{user}",  # the gateway's id may differ from the web id
            user_identifier=user,
            in_reply_to=f"{user}:{client_message_id}",
        )


def settings(**overrides: Any) -> WebSettings:
    values: dict[str, Any] = {
        "dev_open": True,
        "tokens": {TOKEN: "alice"},
        "max_text_chars": 1000,
        "streaming": True,
    }
    return WebSettings(**{**values, **overrides})


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serve_web(
    timing: StreamTiming | None = None,
    hub: LiveHub | None = None,
    *,
    stash: MemoryStash | None = None,
    limits: FileLimits | None = None,
    **overrides: Any,
) -> AsyncIterator[ServedWeb]:
    """The channel's routes in a Starlette app on a free loopback port (taking files into
    `stash` within `limits` when given one)."""
    inbox, feed, history = MemoryInbox(), MemoryFeed(), MemoryHistory()
    rejections: list[tuple[int, str]] = []
    channel = WebChannel(
        settings(**overrides),
        inbox,
        feed,
        NoExports(),
        clock=lambda: NOW,
        on_rejected=lambda status, reason: rejections.append((status, reason)),
        history=history,
        hub=hub,
        timing=timing or StreamTiming(poll_interval=0.2, heartbeat_interval=15, max_seconds=60),
        files=stash,
        file_limits=lambda: limits or FileLimits(),
    )
    await channel.start()
    port = free_port()
    server = _QuietServer(
        uvicorn.Config(
            Starlette(routes=list(channel.routes())),
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
    base_url = f"http://127.0.0.1:{port}"
    client = httpx.AsyncClient(base_url=base_url, timeout=10)
    try:
        yield ServedWeb(channel, inbox, feed, history, stash, client, base_url, rejections)
    finally:
        await client.aclose()
        await channel.stop()  # ends open streams, so the server can stop
        server.should_exit = True
        await serving


@dataclass(frozen=True)
class Event:
    """One server-sent event (`name` ":" for a comment line)."""

    name: str
    data: Any
    id: str | None = None


class EventReader:
    """Reads the server-sent events of an open streaming response, one at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()

    async def next(self, *, comments: bool = False) -> Event:
        """The next event (comments only when asked for); fails when the stream ends."""
        name, event_id, data = "message", None, []
        async for line in self._lines:
            if line.startswith(":"):
                if comments:
                    return Event(":", line[1:].strip())
                continue
            if not line:
                if data:
                    return Event(name, json.loads("\n".join(data)), event_id)
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "id":
                event_id = value
            elif key == "data":
                data.append(value)
        raise EOFError("the stream ended")

    async def until(self, name: str) -> list[Event]:
        """Events up to and including the next one called `name`."""
        seen = []
        while True:
            event = await self.next()
            seen.append(event)
            if event.name == name:
                return seen


@contextlib.asynccontextmanager
async def open_stream(
    client: httpx.AsyncClient,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[EventReader]:
    """An event stream of GET /web/v1/messages; asserts it is one."""
    all_headers = {"accept": "text/event-stream", **(headers or {})}
    async with client.stream(
        "GET", "/web/v1/messages", params=params or {"user": "alice"}, headers=all_headers
    ) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield EventReader(response)
