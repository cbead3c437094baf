"""The handle of a live Slack message (what `channels.live` stores with the turn) and what this
process streamed into it.

A live message is either a native stream (`chat.startStream`, mode `stream`: Markdown appended
with `chat.appendStream`, finished with `chat.stopStream`) or an ordinary message
(`chat.postMessage`, mode `update`: replaced with `chat.update`). The handle says which, so that
the final send finishes it the right way in any process; the text streamed is known only to the
process that streamed it (`StreamedText`), and only that process can finish a stream by
appending the rest instead of replacing the whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from primitives.bounded_cache import BoundedCache

LiveMode = Literal["stream", "update"]

STREAMED_ENTRIES = 4096  # live messages whose streamed text this process remembers


@dataclass(frozen=True, slots=True)
class LiveMessage:
    """A live Slack message: its conversation, its `ts` and how it is written."""

    channel: str
    ts: str
    mode: LiveMode
    thread_ts: str | None = None

    def to_handle(self) -> dict[str, Any]:
        """The handle as JSON values (`LiveReply.handle`)."""
        handle: dict[str, Any] = {"channel": self.channel, "ts": self.ts, "mode": self.mode}
        if self.thread_ts:
            handle["thread_ts"] = self.thread_ts
        return handle

    @classmethod
    def from_handle(cls, handle: Mapping[str, Any]) -> LiveMessage | None:
        """The message a stored handle names, or None when it is not a Slack handle."""
        channel, ts, mode = handle.get("channel"), handle.get("ts"), handle.get("mode")
        if not (isinstance(channel, str) and channel and isinstance(ts, str) and ts):
            return None
        if mode not in ("stream", "update"):
            return None
        thread_ts = handle.get("thread_ts")
        return cls(channel, ts, mode, thread_ts if isinstance(thread_ts, str) else None)

    @property
    def key(self) -> str:
        """The message's key in `StreamedText`."""
        return f"{self.channel}:{self.ts}"


class StreamedText:
    """The Markdown this process appended to each live stream, so that the final send can
    append only the rest when the committed text continues it (bounded: a forgotten entry
    only means the message is replaced instead of continued)."""

    def __init__(self, entries: int = STREAMED_ENTRIES) -> None:
        self._texts: BoundedCache[str, str] = BoundedCache(entries)

    def record(self, message: LiveMessage, text: str) -> None:
        """`text` is what the stream shows now."""
        self._texts.put(message.key, text)

    def shown(self, message: LiveMessage) -> str | None:
        """What the stream shows, when this process wrote it; None when it does not know."""
        return self._texts.get(message.key)

    def forget(self, message: LiveMessage) -> None:
        """The stream is finished."""
        self._texts.pop(message.key)
