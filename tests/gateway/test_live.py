"""The live-reply driver: paced, latest-state platform updates; the handle stored once; failures
that never cost the answer."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping
from typing import Any

import pytest

from channels.live import LIVE_KEY, LiveStoppedError
from errors import DeliveryError
from gateway.live import HandleOnly, LiveProgress
from sessions.turn_values import LIVE_REPLY_KEY


class RecordingReply:
    """A `LiveReply` that records its calls (with their times) and can be told to fail."""

    def __init__(self, *, call_seconds: float = 0.0) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.closed: list[bool] = []
        self.failures: list[Exception] = []
        self.call_seconds = call_seconds
        self._handle: dict[str, Any] | None = None
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def handle(self) -> Mapping[str, Any] | None:
        return self._handle

    async def _call(self, kind: str, text: str) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.call_seconds:
                await asyncio.sleep(self.call_seconds)
            self.calls.append((kind, text, time.monotonic()))
            if self.failures:
                raise self.failures.pop(0)
            if kind == "text" and self._handle is None:
                self._handle = {"ts": "1.0"}
        finally:
            self.in_flight -= 1

    async def status(self, text: str) -> None:
        await self._call("status", text)

    async def text(self, text: str) -> None:
        await self._call("text", text)

    async def close(self, *, committed: bool) -> None:
        self.closed.append(committed)


class Remembered:
    def __init__(self) -> None:
        self.handles: list[Mapping[str, Any]] = []

    async def __call__(self, handle: Mapping[str, Any]) -> None:
        self.handles.append(dict(handle))


def driver(reply: RecordingReply, remember: Remembered, **kwargs: Any) -> LiveProgress:
    return LiveProgress(
        reply,
        interval=kwargs.pop("interval", 0.05),
        status_texts={"tool": "Running {detail} now"},
        remember=remember,
        **kwargs,
    )


async def wait_for_calls(reply: RecordingReply, count: int) -> None:
    async with asyncio.timeout(5):
        while len(reply.calls) < count:
            await asyncio.sleep(0.005)


def test_the_turns_key_is_the_channels_key() -> None:
    assert LIVE_REPLY_KEY == LIVE_KEY


async def test_status_then_text_paced_and_cumulative() -> None:
    reply, remember = RecordingReply(), Remembered()
    live = driver(reply, remember, interval=0.05)
    live.status("thinking")
    await wait_for_calls(reply, 1)
    for word in ("Hello", " there", ",", " friend"):
        live.text(word)
        await asyncio.sleep(0.01)
    await wait_for_calls(reply, 2)
    handle = await live.settle()
    kinds = [kind for kind, _, _ in reply.calls]
    assert kinds[0] == "status"
    assert reply.calls[0][1] == "Thinking…"
    texts = [text for kind, text, _ in reply.calls if kind == "text"]
    # Cumulative, never more calls than pieces, the last one complete (or settled before it).
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert len(texts) < 4
    times = [at for kind, _, at in reply.calls if kind == "text"]
    assert all(later - earlier >= 0.045 for earlier, later in itertools.pairwise(times))
    assert handle == {"ts": "1.0"}
    assert remember.handles == [{"ts": "1.0"}]  # stored once
    assert reply.max_in_flight == 1


async def test_the_first_text_does_not_wait_for_the_pace_of_the_status() -> None:
    reply, remember = RecordingReply(), Remembered()
    live = driver(reply, remember, interval=10.0)
    live.status("thinking")
    await wait_for_calls(reply, 1)
    live.text("Hi")
    await wait_for_calls(reply, 2)
    live.text(" there")  # the second text keeps the pace
    await asyncio.sleep(0.05)
    assert [kind for kind, _, _ in reply.calls] == ["status", "text"]
    await live.settle()


async def test_status_texts_and_details() -> None:
    reply, remember = RecordingReply(), Remembered()
    live = driver(reply, remember, interval=0.0)
    live.status("tool", "orders__lookup")
    await wait_for_calls(reply, 1)
    live.status("reading")
    await wait_for_calls(reply, 2)
    await live.settle()
    assert [text for _, text, _ in reply.calls] == ["Running orders__lookup now", "Reading…"]


async def test_rate_limit_pauses_and_the_text_catches_up() -> None:
    reply, remember = RecordingReply(), Remembered()
    reply.failures.append(DeliveryError("slow down", retry_after=0.2))
    live = driver(reply, remember, interval=0.01)
    live.text("one")
    await wait_for_calls(reply, 1)
    failed_at = reply.calls[0][2]
    live.text(" two")
    await wait_for_calls(reply, 2)
    assert reply.calls[1][1] == "one two"
    assert reply.calls[1][2] - failed_at >= 0.19
    await live.settle()


async def test_refused_text_stops_text_updates_but_the_handle_survives() -> None:
    reply, remember = RecordingReply(), Remembered()
    live = driver(reply, remember, interval=0.0)
    live.text("first")
    await wait_for_calls(reply, 1)
    reply.failures.append(DeliveryError("not allowed", permanent=True))
    live.text(" second")
    await wait_for_calls(reply, 2)
    live.text(" third")
    await asyncio.sleep(0.05)
    assert len(reply.calls) == 2
    assert await live.settle() == {"ts": "1.0"}


async def test_user_stop_ends_the_updates() -> None:
    reply, remember = RecordingReply(), Remembered()
    live = driver(reply, remember, interval=0.0)
    live.text("a")
    await wait_for_calls(reply, 1)
    reply.failures.append(LiveStoppedError())
    live.text("b")
    await wait_for_calls(reply, 2)
    live.status("thinking")
    live.text("c")
    await asyncio.sleep(0.05)
    assert len(reply.calls) == 2
    await live.settle()


async def test_settle_waits_for_the_update_in_flight() -> None:
    reply, remember = RecordingReply(call_seconds=0.1), Remembered()
    live = driver(reply, remember, interval=0.0)
    live.text("answer")
    await asyncio.sleep(0.02)  # the call is in flight
    assert await live.settle() == {"ts": "1.0"}
    assert [kind for kind, _, _ in reply.calls] == ["text"]
    live.text(" more")  # after settling nothing more is shown
    await asyncio.sleep(0.05)
    assert len(reply.calls) == 1


async def test_reset_replaces_the_text_and_a_resumed_handle_is_not_stored_again() -> None:
    reply, remember = RecordingReply(), Remembered()
    reply._handle = {"ts": "9.9"}
    live = driver(reply, remember, interval=0.0, resumed={"ts": "9.9"})
    live.text("Let me look that up.")
    await wait_for_calls(reply, 1)
    live.reset()
    live.status("searching")
    await wait_for_calls(reply, 2)
    live.text("Found it.")
    await wait_for_calls(reply, 3)
    assert [text for _, text, _ in reply.calls] == [
        "Let me look that up.",
        "Searching earlier conversations…",
        "Found it.",
    ]
    assert await live.settle() == {"ts": "9.9"}
    assert remember.handles == []


async def test_close_reports_and_never_raises() -> None:
    class FailingClose(RecordingReply):
        async def close(self, *, committed: bool) -> None:
            raise DeliveryError("gone")

    live = driver(FailingClose(), Remembered())
    await live.settle()
    await live.close(committed=True)


async def test_handle_only_progress_returns_the_earlier_handle() -> None:
    progress = HandleOnly({"stream_id": "s1"})
    progress.status("thinking")
    progress.text("ignored")
    assert await progress.settle() == {"stream_id": "s1"}


@pytest.mark.parametrize("leading", [" ", "\n\n"])
async def test_leading_whitespace_is_not_shown(leading: str) -> None:
    reply, remember = RecordingReply(), Remembered()
    live = driver(reply, remember, interval=0.0)
    live.text(leading)
    await asyncio.sleep(0.02)
    assert reply.calls == []
    live.text("Hi")
    await wait_for_calls(reply, 1)
    assert reply.calls[0][1] == "Hi"
    await live.settle()
