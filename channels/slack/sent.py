"""What Slack already holds of a reply, so that a send repeating an earlier attempt posts only
what is missing.

Every piece of a reply the sender posts carries Slack message metadata naming the reply and the
piece (`piece_metadata`). When the outbox hands over a reply whose earlier sender died mid-send
(`OutboundMessage.resumed`), the sender first reads the conversation (`conversations.history`,
or `conversations.replies` in a thread) from the inbound message on, with the metadata, and
skips the pieces found. Slack is asked only for such replies, which are rare; a conversation
Slack will not show (a missing scope, a user id instead of a conversation id) is logged and the
reply posted again: at least once, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.refusals import delivery_error, error_code, is_transient
from errors import DeliveryError

log = structlog.stdlib.get_logger(__name__)

EVENT_TYPE = "assistant_reply"
LOOKUP_LIMIT = 200  # messages read: a DM or thread rarely moves this much within a lease
LOOKUP_PREFIXES = ("C", "D", "G")  # conversation ids Slack's history methods take


def piece_metadata(reply_id: str, piece: int) -> dict[str, Any]:
    """The metadata of one posted piece of a reply."""
    return {"event_type": EVENT_TYPE, "event_payload": {"reply": reply_id, "piece": piece}}


async def posted_pieces(
    client: AsyncWebClient,
    *,
    reply_id: str,
    channel: str,
    thread_ts: str | None,
    oldest: str | None,
) -> dict[int, str]:
    """The pieces of reply `reply_id` Slack holds in the conversation: piece number → `ts`.

    Empty when Slack cannot be asked here; raises a transient `DeliveryError` when it could
    not be asked now (a rate limit, an outage), so the send is retried rather than repeated.
    """
    if not channel.startswith(LOOKUP_PREFIXES):
        log.info("slack.resend_unchecked", reply_id=reply_id, reason="not a conversation id")
        return {}
    arguments: dict[str, Any] = {
        "channel": channel,
        "include_all_metadata": True,
        "limit": LOOKUP_LIMIT,
    }
    if oldest:
        arguments["oldest"] = oldest
    try:
        if thread_ts:
            answer = await client.conversations_replies(ts=thread_ts, **arguments)
        else:
            answer = await client.conversations_history(**arguments)
    except SlackApiError as exc:
        if is_transient(exc):
            raise delivery_error(exc) from exc
        log.warning("slack.resend_unchecked", reply_id=reply_id, reason=error_code(exc))
        return {}
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DeliveryError(f"Slack unreachable: {exc or type(exc).__name__}") from exc
    found = {
        piece: str(message["ts"])
        for message in answer.get("messages") or []
        if (piece := _piece_of(message, reply_id)) is not None
    }
    log.info("slack.resend_checked", reply_id=reply_id, pieces_found=len(found))
    return found


def _piece_of(message: Mapping[str, Any], reply_id: str) -> int | None:
    metadata = message.get("metadata")
    if not isinstance(metadata, Mapping) or metadata.get("event_type") != EVENT_TYPE:
        return None
    payload = metadata.get("event_payload")
    if not isinstance(payload, Mapping) or payload.get("reply") != reply_id:
        return None
    piece = payload.get("piece")
    return piece if isinstance(piece, int) and message.get("ts") else None
