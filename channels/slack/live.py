"""A Slack answer shown while it is written (`channels.live.LiveReply`).

Where Slack allows it the answer is a native stream: `chat.startStream` in the reply's thread,
then `chat.appendStream` with the Markdown that is new, finished by the final send
(`finish.py`). A stream needs a thread, and outside a DM the recipient (`recipient_team_id`,
`recipient_user_id`); where there is none (a top-level DM message: Slack shows neither streams
nor assistant status outside a thread) or Slack refuses one (the app lacks the agent feature,
the conversation type does not allow it), the answer is an ordinary message instead: posted once
with `chat.postMessage`, then replaced with `chat.update`. While the assistant works, the
thread shows a status line (`assistant.threads.setStatus`); Slack clears it when the app
replies in the thread.

Calls are buffered: text is appended only when enough is new or enough time passed, and every
optional call draws from the workspace's budget (`pacing.py`); the first text goes at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import Conversation
from channels.live import ReplyTarget
from channels.slack.format import markdown_to_mrkdwn, split_for_slack
from channels.slack.handle import LiveMessage, StreamedText
from channels.slack.pacing import SlackPacer
from channels.slack.refusals import delivery_error, error_code, is_transient, slack_call
from errors import DeliveryError
from primitives.bounded_cache import BoundedCache

log = structlog.stdlib.get_logger(__name__)

LIVE_INTERVAL = 1.0  # seconds between two updates of one answer: Slack's pace for a message
LIVE_TEXT_LIMIT = 3000  # the live message shows at most this much; the final send the rest
APPEND_CHARS = 64  # append once this much text is new ...
APPEND_SECONDS = 2.0  # ... or this long after the last append
REFUSAL_SECONDS = 600.0  # a conversation that refused a stream is not asked again for so long
REFUSALS = 1024


@dataclass(frozen=True, slots=True)
class LivePlace:
    """Where a live answer goes: the conversation, the thread (None: a top-level DM message)
    and the person reading it (Slack's recipient of a stream)."""

    channel: str
    thread_ts: str | None
    team: str
    user: str
    direct: bool

    @property
    def can_stream(self) -> bool:
        """A stream needs a thread, and outside a DM the recipient."""
        return bool(self.thread_ts) and (self.direct or bool(self.team and self.user))


class LiveShared:
    """What every live reply of one Slack channel shares: the workspace budgets, the text
    streamed so far (read by the final send) and the conversations that refused a stream."""

    def __init__(
        self, *, streamed: StreamedText, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        self.pacer = SlackPacer(clock=clock)
        self.streamed = streamed
        self.no_stream: BoundedCache[str, str] = BoundedCache(
            REFUSALS, ttl=REFUSAL_SECONDS, clock=clock
        )


class SlackLiveReply:
    """One answer on (at most) one Slack message; see the module docstring."""

    def __init__(
        self,
        client: AsyncWebClient,
        place: LivePlace,
        shared: LiveShared,
        *,
        resume: LiveMessage | None = None,
        resumed: bool = False,
    ) -> None:
        self.client = client
        self.place = place
        self.shared = shared
        self._message = resume
        # A resumed reply (the process before died mid-answer) never creates a message.
        self._frozen = resumed or resume is not None
        self._sent = ""  # the text the message shows (Markdown in a stream, else as given)
        self._sent_at = 0.0
        self._status = ""  # the status shown, "" when none
        self._status_refused = not place.thread_ts

    @property
    def handle(self) -> Mapping[str, Any] | None:
        """The live message's handle, once it exists (`LiveMessage.to_handle`)."""
        return self._message.to_handle() if self._message is not None else None

    async def status(self, text: str) -> None:
        """Show `text` as the thread's status, unless Slack refused a status here before."""
        if self._status_refused or text == self._status or self.place.thread_ts is None:
            return
        try:
            await self.client.assistant_threads_setStatus(
                channel_id=self.place.channel, thread_ts=self.place.thread_ts, status=text
            )
        except SlackApiError as exc:
            if is_transient(exc):
                raise delivery_error(exc) from exc
            self._status_refused = True  # not asked again for this reply
            log.info("slack.status_refused", channel=self.place.channel, error=error_code(exc))
            return
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeliveryError(f"Slack unreachable: {exc or type(exc).__name__}") from exc
        self._status = text

    async def text(self, text: str) -> None:
        """Show the answer so far (cumulative): create the message with the first text, then
        append (stream) or replace (update) when enough is new and the budget allows."""
        if self._frozen:
            return
        shown = text[:LIVE_TEXT_LIMIT]
        if not shown.strip() or shown == self._sent:
            return
        if self._message is None:
            await self._create(shown)
        elif self._message.mode == "stream":
            await self._append(self._message, shown)
        else:
            await self._replace(self._message, shown)

    async def close(self, *, committed: bool) -> None:
        """Clear a status Slack will not clear: one shown after the live message was created
        (the final send only edits it) or when no reply follows. A stream left open when no
        reply was committed stays open: the retried turn's send finishes it."""
        if not self._status or self.place.thread_ts is None:
            return
        if committed and self._message is None:
            return  # the reply posted in the thread clears it
        try:
            await self.client.assistant_threads_setStatus(
                channel_id=self.place.channel, thread_ts=self.place.thread_ts, status=""
            )
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("slack.status_not_cleared", channel=self.place.channel, error=str(exc))
        else:
            self._status = ""

    async def _create(self, shown: str) -> None:
        place = self.place
        if self._may_stream() and await self._start_stream(shown):
            return
        if not self.shared.pacer.take(place.team, "chat.update"):
            # A message edited live is finished with one more `chat.update`; when the
            # workspace's budget has none left for it, the answer is posted whole once it is
            # ready (`chat.postMessage` has no per-minute tier) and the status shows meanwhile.
            self._frozen = True
            log.info("slack.live_text_deferred", channel=place.channel)
            return
        answer = await slack_call(
            self.client.chat_postMessage(
                channel=place.channel,
                text=_mrkdwn(shown),
                thread_ts=place.thread_ts,
                mrkdwn=True,
            )
        )
        channel = str(answer.get("channel") or place.channel)  # a user id posts to the DM
        self._created(LiveMessage(channel, str(answer["ts"]), "update", place.thread_ts), shown)

    def _may_stream(self) -> bool:
        place = self.place
        return (
            place.can_stream
            and place.channel not in self.shared.no_stream
            and self.shared.pacer.take(place.team, "chat.startStream")
        )

    async def _start_stream(self, shown: str) -> bool:
        """Start a stream with the first text; False when Slack refuses streams here (the
        caller posts instead). A rate limit also falls back, since nothing was created."""
        place = self.place
        try:
            answer = await self.client.chat_startStream(
                channel=place.channel,
                thread_ts=str(place.thread_ts),
                markdown_text=shown,
                recipient_team_id=place.team or None,
                recipient_user_id=place.user or None,
            )
        except SlackApiError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if status >= 500:
                self._frozen = True  # created or not, nobody knows: no live message
                raise delivery_error(exc) from exc
            if status != 429 and error_code(exc) != "ratelimited":
                self.shared.no_stream.put(place.channel, error_code(exc))
            log.info("slack.stream_refused", channel=place.channel, error=error_code(exc))
            return False
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._frozen = True
            raise DeliveryError(f"Slack unreachable: {exc or type(exc).__name__}") from exc
        message = LiveMessage(
            str(answer.get("channel") or place.channel),
            str(answer["ts"]),
            "stream",
            place.thread_ts,
        )
        self._created(message, shown)
        return True

    def _created(self, message: LiveMessage, shown: str) -> None:
        self._message = message
        self._status = ""  # the app replied in the thread: Slack cleared the status
        self._shown(shown)
        log.info("slack.live_started", channel=message.channel, ts=message.ts, mode=message.mode)

    async def _append(self, message: LiveMessage, shown: str) -> None:
        if not shown.startswith(self._sent):
            await self._restart_as_update(message, shown)
            return
        new = shown[len(self._sent) :]
        waited = self.shared.clock() - self._sent_at
        if len(new) < APPEND_CHARS and waited < APPEND_SECONDS:
            return
        if not self.shared.pacer.take(self.place.team, "chat.appendStream"):
            return
        try:
            await self.client.chat_appendStream(
                channel=message.channel, ts=message.ts, markdown_text=new
            )
        except SlackApiError as exc:
            if not is_transient(exc):
                self._frozen = True  # the stream ended (expired, stopped): the send replaces
            raise delivery_error(exc) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeliveryError(f"Slack unreachable: {exc or type(exc).__name__}") from exc
        self._shown(shown)

    async def _restart_as_update(self, message: LiveMessage, shown: str) -> None:
        """The text was replaced (the model started over after a tool): a stream cannot take
        text back, so stop it and write the message with `chat.update` from now on."""
        if not self.shared.pacer.take(self.place.team, "chat.update"):
            return
        try:
            await self.client.chat_stopStream(channel=message.channel, ts=message.ts)
        except SlackApiError as exc:
            if is_transient(exc):
                raise delivery_error(exc) from exc
            log.info("slack.stream_not_stopped", channel=message.channel, error=error_code(exc))
        self.shared.streamed.forget(message)
        self._message = LiveMessage(message.channel, message.ts, "update", message.thread_ts)
        await self._write(self._message, shown)

    async def _replace(self, message: LiveMessage, shown: str) -> None:
        if self.shared.pacer.take(self.place.team, "chat.update"):
            await self._write(message, shown)

    async def _write(self, message: LiveMessage, shown: str) -> None:
        await slack_call(
            self.client.chat_update(channel=message.channel, ts=message.ts, text=_mrkdwn(shown))
        )
        self._shown(shown)

    def _shown(self, shown: str) -> None:
        self._sent, self._sent_at = shown, self.shared.clock()
        if self._message is not None and self._message.mode == "stream":
            self.shared.streamed.record(self._message, shown)


def _mrkdwn(markdown: str) -> str:
    """The live text as one Slack message (mrkdwn, within the message limit)."""
    pieces = split_for_slack(markdown_to_mrkdwn(markdown))
    return pieces[0] if pieces else "…"


def live_place(target: ReplyTarget) -> LivePlace:
    """Where a turn's live answer goes, from the inbound message's reply address. The
    recipient is the sender (`TEAM:USER`, or the bare user id with the team from the reply
    context)."""
    context = target.reply_context
    team, _, user = target.user_identifier.rpartition(":")
    thread_ts = context.get("thread_ts") or target.thread_id or None
    return LivePlace(
        channel=str(context.get("channel") or target.channel_id),
        thread_ts=str(thread_ts) if thread_ts else None,
        team=team or str(context.get("team_id") or ""),
        user=user,
        direct=target.conversation is Conversation.DIRECT,
    )
