"""The web channel's event stream (`GET /web/v1/messages` with `Accept: text/event-stream`).

Server-sent events, one per update:

- `status` `{"in_reply_to", "text"}`: what the assistant is doing for that message;
- `text` `{"in_reply_to", "text"}`: the answer so far (cumulative: replace, don't append);
- `done` `{"in_reply_to", "committed"}`: the answer is over (when committed, its `message`
  follows or came already);
- `message`: one reply, exactly an item of the JSON feed, its cursor as the event's `id`
  (resume with `after=` or the `Last-Event-ID` header);
- comment lines as heartbeats.

Replies come from the feed (the database): read when the hub wakes the stream (a live reply of
this process closed) and at least every `poll_interval` seconds otherwise, so a reply committed
by another process arrives as well. Status and text come from this process's `LiveHub`, and
none is sent for an answer whose message the stream already sent. A stream ends by itself
after `max_seconds` (the client reconnects with its cursor), which also bounds how long a
server that shuts down waits for it.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from channels.plugin import ReplyFeed
from channels.web.live import LiveEvent, LiveHub, Subscription
from errors import StorageError

log = structlog.stdlib.get_logger(__name__)

PAGE = 100  # feed items per read
FINISHED_MEMORY = 64  # answers whose message was sent, remembered to drop late live events


@dataclass(frozen=True, slots=True)
class StreamTiming:
    """How often a stream reads the feed, sends a heartbeat, and how long it lasts."""

    poll_interval: float = 2.0
    heartbeat_interval: float = 15.0
    max_seconds: float = 25.0
    # How long a client waits before reconnecting (the SSE `retry` field), in seconds.
    retry: float = 1.0


def sse(event: str, data: Any, *, event_id: str | None = None) -> bytes:
    """One server-sent event (JSON data on one line)."""
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode()


def coalesce(events: list[LiveEvent], finished: deque[str]) -> list[LiveEvent]:
    """The live events worth sending: none for an answer already finished, and of several
    text events of one answer only the last (the text is cumulative)."""
    last_text = {
        event.in_reply_to: index for index, event in enumerate(events) if event.kind == "text"
    }
    return [
        event
        for index, event in enumerate(events)
        if event.in_reply_to not in finished
        and (event.kind != "text" or last_text[event.in_reply_to] == index)
    ]


async def new_messages(feed: ReplyFeed, user: str, after: int) -> list[tuple[dict[str, Any], int]]:
    """The replies after `after`, each with its own cursor.

    The feed gives one cursor per read: one new reply (the usual case) costs one read; when
    several came at once (a client coming back), each one's cursor is read one by one, so an
    event id is always exactly where a reconnecting client must resume.
    """
    items, cursor = await feed.replies(user, after=after, limit=PAGE)
    if len(items) <= 1:
        return [(item, cursor) for item in items]
    found: list[tuple[dict[str, Any], int]] = []
    position = after
    for _ in items:
        one, position = await feed.replies(user, after=position, limit=1)
        if not one:
            break
        found.append((one[0], position))
    return found


class EventStream:
    """The events of one open stream, as bytes for the response body."""

    def __init__(
        self,
        hub: LiveHub,
        feed: ReplyFeed,
        user: str,
        *,
        after: int,
        timing: StreamTiming,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.hub = hub
        self.feed = feed
        self.user = user
        self.cursor = after
        self.timing = timing
        self.clock = clock or asyncio.get_running_loop().time
        self._finished: deque[str] = deque(maxlen=FINISHED_MEMORY)

    def open(self) -> Subscription:
        """Join the hub (raises `TooManyStreamsError`): done before the response starts, so
        the limit is answered with a status code."""
        return self.hub.subscribe(self.user)

    async def body(self, subscription: Subscription) -> AsyncIterator[bytes]:
        """The stream's bytes until it closes, times out or the client leaves (cancelled)."""
        try:
            yield f"retry: {int(self.timing.retry * 1000)}\n\n".encode()
            async for chunk in self._events(subscription):
                yield chunk
        finally:
            self.hub.unsubscribe(self.user, subscription)

    async def _events(self, subscription: Subscription) -> AsyncIterator[bytes]:
        now = self.clock()
        deadline = now + self.timing.max_seconds
        next_poll = now + self.timing.poll_interval
        last_write = now
        while not subscription.closed:
            changed, events = subscription.take()
            if now >= next_poll:
                changed, next_poll = True, now + self.timing.poll_interval
            try:
                messages = await self._messages() if changed else b""
            except StorageError as exc:
                # The client reconnects with its cursor; nothing is lost.
                log.warning("web.stream_feed_failed", error=str(exc).splitlines()[0])
                return
            chunk = messages + self._live(events)
            now = self.clock()
            if not chunk and now - last_write >= self.timing.heartbeat_interval:
                chunk = b": keep-alive\n\n"
            if chunk:
                yield chunk
                last_write = now
            if now >= deadline:
                return
            wake_at = min(next_poll, deadline, last_write + self.timing.heartbeat_interval)
            await subscription.wait(wake_at - now)
            now = self.clock()

    async def _messages(self) -> bytes:
        chunks = []
        while True:
            found = await new_messages(self.feed, self.user, self.cursor)
            for item, cursor in found:
                self.cursor = cursor
                if item.get("in_reply_to"):
                    self._finished.append(str(item["in_reply_to"]))
                chunks.append(sse("message", item, event_id=str(cursor)))
            if len(found) < PAGE:
                return b"".join(chunks)

    def _live(self, events: list[LiveEvent]) -> bytes:
        return b"".join(sse(event.kind, event.data()) for event in coalesce(events, self._finished))
