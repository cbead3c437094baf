"""Finishing a live Slack message with the committed reply (the reply's first piece; the
sender posts the rest as follow-ups).

The committed text is authoritative, and finishing must be idempotent across retries and
restarts, never posting a second message: a stream this process wrote and the reply continues
is stopped with the rest of the text (`chat.stopStream`); any other stream is stopped and then
replaced (`chat.update`), and a stream that is already stopped (an earlier attempt, or Slack
expired it: `message_not_in_streaming_state`) is only replaced. An ordinary live message is
replaced. Replacing with the same text again is harmless, so a retry simply does it again.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.format import markdown_to_mrkdwn, split_for_slack
from channels.slack.handle import LiveMessage, StreamedText
from channels.slack.refusals import delivery_error, error_code, is_transient, slack_call
from errors import DeliveryError

log = structlog.stdlib.get_logger(__name__)

# The live message is gone or can no longer be edited: posting the answer anew would be a
# second message, so the reply fails for good instead.
LOST_MESSAGE_ERRORS = frozenset({"message_not_found", "cant_update_message", "edit_window_closed"})


@dataclass(frozen=True, slots=True)
class LivePieces:
    """A reply cut for a live message: `first` in the message's own format (Markdown for a
    stream, mrkdwn otherwise) and the follow-ups in mrkdwn."""

    first: str
    rest: tuple[str, ...]


def live_pieces(content: str, message: LiveMessage) -> LivePieces:
    """The reply's pieces when its first piece finishes `message`."""
    if message.mode == "update":
        pieces = split_for_slack(markdown_to_mrkdwn(content)) or ["…"]
        return LivePieces(pieces[0], tuple(pieces[1:]))
    text = content.strip()
    first = (split_for_slack(text) or ["…"])[0]
    rest = text[len(first) :].strip() if text.startswith(first) else ""
    return LivePieces(first, tuple(split_for_slack(markdown_to_mrkdwn(rest))))


class LiveFinisher:
    """Finishes live messages (see the module docstring)."""

    def __init__(self, client: AsyncWebClient, streamed: StreamedText) -> None:
        self.client = client
        self.streamed = streamed

    async def finish(self, message: LiveMessage, first: str) -> None:
        """Make `message` show `first` for good; `DeliveryError` when Slack refuses."""
        if message.mode == "stream":
            await self._finish_stream(message, first)
        else:
            await self._replace(message, first)
        self.streamed.forget(message)
        log.info("slack.live_finished", channel=message.channel, ts=message.ts, mode=message.mode)

    async def _finish_stream(self, message: LiveMessage, first: str) -> None:
        shown = self.streamed.shown(message)
        if shown is not None and first.startswith(shown):
            rest = first[len(shown) :]
            if await self._stop(message, rest):
                return
        elif not await self._stop(message, ""):
            log.info("slack.stream_already_stopped", channel=message.channel, ts=message.ts)
        await self._replace(message, first)

    async def _stop(self, message: LiveMessage, rest: str) -> bool:
        """Stop the stream, appending `rest`; False when Slack says it is not streaming."""
        try:
            await self.client.chat_stopStream(
                channel=message.channel, ts=message.ts, markdown_text=rest or None
            )
        except SlackApiError as exc:
            if is_transient(exc) or error_code(exc) in LOST_MESSAGE_ERRORS:
                raise _refusal(exc) from exc
            log.info("slack.stream_stop_refused", channel=message.channel, error=error_code(exc))
            return False
        return True

    async def _replace(self, message: LiveMessage, text: str) -> None:
        if message.mode == "stream":
            call = self.client.chat_update(
                channel=message.channel, ts=message.ts, markdown_text=text
            )
        else:
            call = self.client.chat_update(channel=message.channel, ts=message.ts, text=text)
        try:
            await slack_call(call)
        except DeliveryError as exc:
            cause = exc.__cause__
            if isinstance(cause, SlackApiError) and error_code(cause) in LOST_MESSAGE_ERRORS:
                raise _refusal(cause) from cause
            raise


def _refusal(exc: SlackApiError) -> DeliveryError:
    code = error_code(exc)
    if code in LOST_MESSAGE_ERRORS:
        return DeliveryError(f"the live Slack message cannot be finished: {code}", permanent=True)
    return delivery_error(exc)
