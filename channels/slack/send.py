"""Slack out: a reply posted with `chat.postMessage` (Markdown converted to mrkdwn, split at
Slack's message limit), or finishing the live message it was streamed into (`finish.py`), a
file with `files.upload_v2`, and Slack's refusals as `DeliveryError`s (`refusals.py`)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import structlog
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import DeliveryReceipt, OutboundMessage
from channels.live import live_handle
from channels.slack.finish import LiveFinisher, live_pieces
from channels.slack.format import markdown_to_mrkdwn, split_for_slack
from channels.slack.handle import LiveMessage, StreamedText
from channels.slack.parse import DIRECT_PREFIXES
from channels.slack.refusals import (
    PERMANENT_ERRORS,
    delivery_error,
    error_code,
    retry_after,
    slack_call,
)
from channels.slack.sent import piece_metadata, posted_pieces
from errors import DeliveryError

__all__ = [
    "PERMANENT_ERRORS",
    "SlackSender",
    "delivery_error",
    "error_code",
    "retry_after",
]

log = structlog.stdlib.get_logger(__name__)


class SlackSender:
    """Posts replies with the bot's Web API client, remembering the pieces of a long reply
    already delivered so that a retry continues where a failure stopped."""

    def __init__(self, client: AsyncWebClient, streamed: StreamedText | None = None) -> None:
        self.client = client
        self.finisher = LiveFinisher(client, streamed or StreamedText())
        self._partial: dict[str, list[str]] = {}  # reply id → ts of the pieces already posted

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Post the reply in its conversation and thread, in pieces when it is long.

        A reply streamed live (`channels.live.live_handle`) finishes that message with its
        first piece instead of posting it. Pieces already delivered are remembered, so a
        retry after a failure part-way continues where it stopped instead of posting the
        first pieces again; a reply whose earlier sender died (`resumed`) learns them from
        Slack (`sent.py`). A reply with a file is delivered only to a direct conversation
        (a permanent `DeliveryError` elsewhere).
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
        posted = self._partial.setdefault(message.message_id, [])
        handle = live_handle(message)
        live = LiveMessage.from_handle(handle) if handle is not None else None
        if live is not None:
            pieces = live_pieces(message.content, live)
            if not posted:
                await self._call(message.message_id, self.finisher.finish(live, pieces.first))
                posted.append(live.ts)
            follow_ups = [pieces.first, *pieces.rest]
            # Follow-ups go where the live message is (a user id resolves to the DM).
            channel = live.channel
        else:
            follow_ups = split_for_slack(markdown_to_mrkdwn(message.content)) or ["…"]
        if message.resumed:
            found = await posted_pieces(
                self.client,
                reply_id=message.message_id,
                channel=channel,
                thread_ts=thread_ts,
                oldest=context.get("ts"),
            )
            while len(posted) < len(follow_ups) and len(posted) in found:
                posted.append(found[len(posted)])
        for number, piece in enumerate(follow_ups[len(posted) :], start=len(posted)):
            answer = await self._call(
                message.message_id,
                self.client.chat_postMessage(
                    channel=channel,
                    text=piece,
                    thread_ts=thread_ts,
                    mrkdwn=True,
                    metadata=piece_metadata(message.message_id, number),
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
        """One Web API call of a send, its failures as `DeliveryError`s; a permanent one
        forgets the pieces delivered."""
        try:
            return await slack_call(call)
        except DeliveryError as exc:
            if exc.permanent:
                self._partial.pop(reply_id, None)
            raise
