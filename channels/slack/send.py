"""Slack out: a reply posted with `chat.postMessage` (Markdown converted to mrkdwn, split at
Slack's message limit), a file with `files.upload_v2`, and Slack's refusals as
`DeliveryError`s that say whether trying again can help."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

import aiohttp
import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import DeliveryReceipt, OutboundMessage
from channels.slack.format import markdown_to_mrkdwn, split_for_slack
from channels.slack.parse import DIRECT_PREFIXES
from errors import DeliveryError

log = structlog.stdlib.get_logger(__name__)

# Slack's answers that trying again cannot fix.
PERMANENT_ERRORS = frozenset(
    {
        "account_inactive",
        "channel_not_found",
        "invalid_auth",
        "is_archived",
        "missing_scope",
        "msg_too_long",
        "no_permission",
        "no_text",
        "not_authed",
        "not_in_channel",
        "restricted_action",
        "token_revoked",
        "user_not_found",
    }
)


class SlackSender:
    """Posts replies with the bot's Web API client, remembering the pieces of a long reply
    already posted so that a retry continues where a failure stopped."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._partial: dict[str, list[str]] = {}  # reply id → ts of the pieces already posted

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Post the reply in its conversation and thread, in pieces when it is long.

        Pieces already posted are remembered, so a retry after a failure part-way continues
        where it stopped instead of posting the first pieces again. A reply with a file is
        delivered only to a direct conversation (a permanent `DeliveryError` elsewhere).
        """
        context = message.reply_context
        channel = str(context.get("channel") or message.channel_id)
        thread_ts = context.get("thread_ts") or message.thread_id or None
        if message.file is not None and not channel.startswith(DIRECT_PREFIXES):
            # Files are exports of a whole session, DMs included; the commands send them only
            # to DMs, and this refuses the whole reply (its text names the file and a link)
            # should one ever be addressed to a channel.
            log.error("slack.file_refused", channel=channel, reply_id=message.message_id)
            raise DeliveryError(
                f"refusing to upload {message.file.filename} into {channel}, "
                "a conversation others can read",
                permanent=True,
            )
        pieces = split_for_slack(markdown_to_mrkdwn(message.content)) or ["…"]
        posted = self._partial.setdefault(message.message_id, [])
        for piece in pieces[len(posted) :]:
            answer = await self._call(
                message.message_id,
                self.client.chat_postMessage(
                    channel=channel, text=piece, thread_ts=thread_ts, mrkdwn=True
                ),
            )
            posted.append(str(answer.get("ts") or ""))
        if message.file is not None:
            # The file goes last: a retry after a failed upload posts no text twice.
            await self._call(
                message.message_id,
                self.client.files_upload_v2(
                    channel=channel,
                    thread_ts=thread_ts,
                    content=message.file.content,
                    filename=message.file.filename,
                    title=message.file.filename,
                ),
            )
        self._partial.pop(message.message_id, None)
        return DeliveryReceipt(platform_message_id=posted[0] if posted else None)

    async def _call(self, reply_id: str, call: Awaitable[Any]) -> Any:
        """One Web API call of a send, its failures as `DeliveryError`s."""
        try:
            return await call
        except SlackApiError as exc:
            error = delivery_error(exc)
            if error.permanent:
                self._partial.pop(reply_id, None)
            raise error from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeliveryError(f"Slack unreachable: {exc or type(exc).__name__}") from exc


def error_code(exc: SlackApiError) -> str:
    """The `error` of Slack's answer (`invalid_auth` …), empty when it has none."""
    data = exc.response.data if exc.response is not None else None
    return str(data.get("error", "")) if isinstance(data, Mapping) else ""


def delivery_error(exc: SlackApiError) -> DeliveryError:
    """A refused Web API call as a `DeliveryError`: rate limits with Slack's `Retry-After`,
    the codes in `PERMANENT_ERRORS` permanent, anything else worth another try."""
    status = exc.response.status_code if exc.response is not None else 0
    code = error_code(exc) or f"HTTP {status}"
    if status == 429 or code == "ratelimited":
        headers = exc.response.headers if exc.response is not None else {}
        return DeliveryError(f"Slack rate limit ({code})", retry_after=retry_after(headers))
    return DeliveryError(f"Slack refused the message: {code}", permanent=code in PERMANENT_ERRORS)


def retry_after(headers: Mapping[str, Any]) -> float:
    """Seconds Slack asks to wait (`Retry-After`, whatever its case); 1 when it does not say."""
    for name, value in headers.items():
        if name.lower() == "retry-after":
            raw = value[0] if isinstance(value, list | tuple) else value
            try:
                return max(float(raw), 0.0)
            except (TypeError, ValueError):
                break
    return 1.0
