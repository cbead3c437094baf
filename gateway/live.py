"""Live replies as the gateway runs them: a turn's progress shown on its channel while the
assistant works, without giving up exactly-once replies.

`LiveProgress` is the turn's `TurnProgress` for a channel that can show it
(`channels.live.LiveChannel`). The turn only records (status, text deltas); one task of the
driver makes the platform calls, one at a time and never closer together than the channel's
`live_interval`, always with the latest state (a status seen late is dropped for a newer one;
text is cumulative, so a slow platform sees fewer, larger updates, never a backlog).

Exactly once: as soon as the platform message exists, its handle is stored with the inbound
event (`remember`), so a turn restarted after a crash finishes that message instead of posting
a second one; `settle` stops the updates before the reply is committed and returns the handle,
which the turn puts into the reply's `reply_context` for the outbox's `send` to finish.

Failures never cost the answer: a rate limit pauses the updates for as long as the platform
asks; a refusal or an error stops them (the final `send` still delivers the whole reply, as a
plain message when no live one exists); the user's stop (`LiveStoppedError`) ends them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from typing import Any

from channels.live import LiveReply, LiveStoppedError
from errors import DeliveryError, GatewayError
from gateway.log import get_logger
from sessions.progress import NoProgress, StatusKind

log = get_logger(__name__)

CALL_TIMEOUT = 15.0  # seconds one platform call of a live reply may take
SETTLE_TIMEOUT = 5.0  # seconds the commit waits for an update in flight
MAX_FAILURES = 3  # failed updates (rate limits aside) before the live updates stop

DEFAULT_STATUS_TEXTS: Mapping[str, str] = {
    "thinking": "Thinking…",
    "compacting": "Summarising older messages to make room…",
    "searching": "Searching earlier conversations…",
    "reading": "Reading {detail}…",
    "tool": "Using {detail}…",
}


class HandleOnly(NoProgress):
    """The progress of a turn that shows nothing live but must finish a live message an
    earlier attempt started (the channel's streaming was turned off since)."""

    def __init__(self, handle: Mapping[str, Any]) -> None:
        self.handle = handle

    async def settle(self) -> Mapping[str, Any] | None:
        """The earlier attempt's live message."""
        return self.handle


class LiveProgress:
    """Drives one turn's `LiveReply` from its progress (a `sessions.progress.TurnProgress`)."""

    def __init__(
        self,
        reply: LiveReply,
        *,
        interval: float,
        status_texts: Mapping[str, str],
        remember: Callable[[Mapping[str, Any]], Awaitable[None]],
        resumed: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        observe: Callable[[str, str], None] = lambda _kind, _outcome: None,
    ) -> None:
        self.reply = reply
        # Told (kind, outcome) of every platform call: the metrics.
        self.observe = observe
        self.interval = max(interval, 0.0)
        self.status_texts = status_texts
        self.remember = remember
        self.clock = clock
        self.first_text_at: float | None = None  # when the first text reached the platform
        self.calls = 0
        self._remembered = resumed  # the handle already stored with the inbound event
        self._status: str | None = None  # a status not shown yet
        self._shown_status = ""
        self._text = ""
        self._shown_text = ""
        self._texts_allowed = True
        self._stopped = False  # nothing more is shown (settled, stopped by the user, failing)
        self._failures = 0
        self._next_call_at = 0.0  # pacing: the channel's interval after each call
        self._paused_until = 0.0  # a rate limit: the platform said until when
        self._wake = asyncio.Event()
        self._settling = asyncio.Event()
        self._task = asyncio.create_task(self._pump(), name="live-reply")

    # The turn's side (TurnProgress): record, wake the pump, return at once.

    def status(self, kind: StatusKind, detail: str = "") -> None:
        """Show what the assistant is doing now."""
        template = self.status_texts.get(kind) or DEFAULT_STATUS_TEXTS[kind]
        text = template.replace("{detail}", detail) if detail else template.replace(" {detail}", "")
        if text != self._shown_status:
            self._status = text
            self._wake.set()

    def text(self, delta: str) -> None:
        """More of the answer."""
        if delta:
            self._text += delta
            self._wake.set()

    def reset(self) -> None:
        """What was written so far is not the answer; what comes next replaces it."""
        self._text = ""

    async def settle(self) -> Mapping[str, Any] | None:
        """Stop the updates (waiting a little for one in flight) and store the handle; the
        live message the reply must finish, if one exists."""
        self._stopped = True
        self._settling.set()
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=SETTLE_TIMEOUT)
        except TimeoutError:
            log.warning("live.settle_timeout", seconds=SETTLE_TIMEOUT)
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        handle = self._handle()
        await self._remember(handle)
        return handle

    async def close(self, *, committed: bool) -> None:
        """The turn is over: let the channel clear its indicators."""
        if not self._task.done():
            self._stopped = True
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                await self.reply.close(committed=committed)
        except Exception as exc:  # noqa: BLE001
            # A courtesy: the reply itself is already committed and on its way.
            log.warning("live.close_failed", error=str(exc) or type(exc).__name__)

    # The pump: the platform calls, one at a time.

    async def _pump(self) -> None:
        while not self._stopped:
            await self._wake.wait()
            self._wake.clear()
            while not self._stopped and self._due():
                await self._pace()
                if self._stopped:
                    return
                await self._update()

    def _due(self) -> bool:
        return self._status is not None or (
            self._texts_allowed and bool(self._text.lstrip()) and self._text != self._shown_text
        )

    async def _pace(self) -> None:
        """Wait until the next call is allowed (or the turn settles). The first text goes as
        soon as a rate limit allows, whatever status went just before it: the answer
        appearing is what people wait for (a channel whose platform cannot take it that soon
        paces its own calls)."""
        wait_until = self._paused_until
        if not (self.first_text_at is None and self._texts_allowed and self._text.strip()):
            wait_until = max(wait_until, self._next_call_at)
        delay = wait_until - self.clock()
        if delay > 0:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._settling.wait(), timeout=delay)

    async def _update(self) -> None:
        status, self._status = self._status, None
        text = self._text
        call: Awaitable[None]
        if status is not None and (not text.strip() or not self._texts_allowed):
            call, kind = self.reply.status(status), "status"
            self._shown_status = status
        elif self._texts_allowed and text.strip() and text != self._shown_text:
            # Text wins over a status that came with it: the answer is the better sign of life.
            call, kind = self.reply.text(text.lstrip()), "text"
        else:
            return
        self._next_call_at = self.clock() + self.interval
        self.calls += 1
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                await call
        except LiveStoppedError:
            log.info("live.stopped_by_user")
            self.observe(kind, "stopped")
            self._stopped = True
            return
        except DeliveryError as exc:
            self._failed(kind, exc, exc.retry_after)
            return
        except (GatewayError, OSError, TimeoutError) as exc:
            self._failed(kind, exc, None)
            return
        self.observe(kind, "ok")
        self._failures = 0
        if kind == "text":
            self._shown_text = text
            if self.first_text_at is None:
                self.first_text_at = self.clock()
        await self._remember(self._handle())

    def _failed(self, kind: str, exc: Exception, retry_after: float | None) -> None:
        error = str(exc) or type(exc).__name__
        if retry_after is not None:
            # A rate limit: the platform said when; the text is cumulative, nothing is lost.
            self._paused_until = self.clock() + max(retry_after, self.interval)
            self.observe(kind, "rate_limited")
            log.info("live.rate_limited", kind=kind, retry_after=retry_after)
            self._wake.set()
            return
        self.observe(kind, "failed")
        self._failures += 1
        if kind == "text" or self._failures >= MAX_FAILURES:
            # The final send delivers the answer; it finishes the live message if one exists.
            self._texts_allowed = False
            if self._failures >= MAX_FAILURES:
                self._stopped = True
        log.warning("live.update_failed", kind=kind, error=error, failures=self._failures)

    def _handle(self) -> Mapping[str, Any] | None:
        try:
            handle = self.reply.handle
        except Exception as exc:  # noqa: BLE001
            log.error("live.handle_unreadable", error=repr(exc))
            return self._remembered
        return dict(handle) if handle else self._remembered

    async def _remember(self, handle: Mapping[str, Any] | None) -> None:
        """Store the handle with the inbound event once (a restart finishes that message)."""
        if handle is None or handle == self._remembered:
            return
        try:
            await self.remember(handle)
        except GatewayError as exc:
            # A crash before the commit could now leave this message unfinished and the
            # restarted turn would post another: worth a line, not the answer.
            log.error("live.handle_not_stored", error=str(exc))
            return
        self._remembered = handle
