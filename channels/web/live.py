"""The web channel's live half: what the open event streams of this process are told.

A turn's live reply (`WebLiveReply`) publishes status lines and the answer's text so far to
the `LiveHub`, which hands them to every open stream of that web user (`Subscription`). The
final message never travels through the hub: it is read from the reply feed (the database),
so a reply committed by another gateway process arrives as well. Closing a live reply only
wakes the user's streams, so they read the feed at once instead of at their next poll.

Each subscription keeps at most `capacity` live events and drops the oldest when a consumer
falls behind: the text is cumulative, so a slow consumer loses intermediate text, never the
final message.

Users are keyed by their web id (the feed's key, `ChannelMessage.channel_id`), which is not
always the gateway's user id (a provisioned user's id is derived from it).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Literal

import structlog

log = structlog.stdlib.get_logger(__name__)

LiveKind = Literal["status", "text", "done"]


class TooManyStreamsError(Exception):
    """The user already has as many open streams as one user may."""


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """One update of an answer being written: a status line, its text so far, or its end."""

    kind: LiveKind
    in_reply_to: str
    text: str = ""
    # For `done`: whether a reply was committed (it arrives as a `message`).
    committed: bool = False

    def data(self) -> dict[str, Any]:
        """The event's JSON body as the stream sends it."""
        if self.kind == "done":
            return {"in_reply_to": self.in_reply_to, "committed": self.committed}
        return {"in_reply_to": self.in_reply_to, "text": self.text}


class Subscription:
    """One open stream: its pending live events and whether the feed may have news."""

    def __init__(self, capacity: int) -> None:
        self._events: deque[LiveEvent] = deque(maxlen=capacity)
        self._ready = asyncio.Event()
        # A new stream reads the feed at once (replies after the client's cursor).
        self._feed_changed = True
        self.closed = False
        self.dropped = 0

    def push(self, event: LiveEvent) -> None:
        """Queue a live event; the oldest goes when the queue is full."""
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
        self._events.append(event)
        self._ready.set()

    def wake(self) -> None:
        """A reply may have been committed: read the feed now."""
        self._feed_changed = True
        self._ready.set()

    def close(self) -> None:
        """End the stream (the channel stops)."""
        self.closed = True
        self._ready.set()

    async def wait(self, seconds: float) -> None:
        """Until something happened or `seconds` passed."""
        with suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout=max(seconds, 0.0))

    def take(self) -> tuple[bool, list[LiveEvent]]:
        """Whether the feed must be read, and the live events queued since the last call."""
        self._ready.clear()
        changed, self._feed_changed = self._feed_changed, False
        events = list(self._events)
        self._events.clear()
        return changed, events


class LiveHub:
    """The open streams of this process, per web user, and what is published to them."""

    def __init__(self, *, max_streams_per_user: int = 4, capacity: int = 64) -> None:
        self.max_streams_per_user = max_streams_per_user
        self.capacity = capacity
        self._streams: dict[str, set[Subscription]] = {}
        self._closed = False

    def subscribe(self, user: str) -> Subscription:
        """A new stream of `user`; raises `TooManyStreamsError` over the per-user limit."""
        streams = self._streams.setdefault(user, set())
        if len(streams) >= self.max_streams_per_user:
            raise TooManyStreamsError(
                f"at most {self.max_streams_per_user} event streams per user are open at once"
            )
        subscription = Subscription(self.capacity)
        if self._closed:
            subscription.close()
        streams.add(subscription)
        return subscription

    def unsubscribe(self, user: str, subscription: Subscription) -> None:
        """The stream ended (the client left, or the stream closed)."""
        streams = self._streams.get(user)
        if streams is None:
            return
        streams.discard(subscription)
        if not streams:
            del self._streams[user]
        if subscription.dropped:
            log.info("web.live_events_dropped", dropped=subscription.dropped)

    def streams(self, user: str) -> int:
        """How many streams `user` has open."""
        return len(self._streams.get(user, ()))

    def publish(self, user: str, event: LiveEvent) -> None:
        """Hand a live event to every open stream of `user` (none: nobody is watching)."""
        for subscription in self._streams.get(user, ()):
            subscription.push(event)

    def wake(self, user: str) -> None:
        """Make every open stream of `user` read the feed now."""
        for subscription in self._streams.get(user, ()):
            subscription.wake()

    def close(self) -> None:
        """End every open stream and every stream opened later (the channel stops)."""
        self._closed = True
        for streams in self._streams.values():
            for subscription in streams:
                subscription.close()


class WebLiveReply:
    """One answer shown on the web page while it is written (`channels.live.LiveReply`).

    The web reply is stored delivered and read from the feed, so there is no platform message
    to find again: the handle stays None and the outbox has nothing to finish.
    """

    def __init__(self, hub: LiveHub, user: str, in_reply_to: str) -> None:
        self.hub = hub
        self.user = user
        self.in_reply_to = in_reply_to

    @property
    def handle(self) -> Mapping[str, Any] | None:
        """No platform message: the final reply is the feed's."""
        return None

    async def status(self, text: str) -> None:
        """Show what the assistant is doing."""
        self.hub.publish(self.user, LiveEvent("status", self.in_reply_to, text))

    async def text(self, text: str) -> None:
        """Show the answer so far (cumulative)."""
        self.hub.publish(self.user, LiveEvent("text", self.in_reply_to, text))

    async def close(self, *, committed: bool) -> None:
        """Tell the page the answer is over, and wake the streams to read the committed reply
        from the feed at once."""
        self.hub.publish(self.user, LiveEvent("done", self.in_reply_to, committed=committed))
        self.hub.wake(self.user)
