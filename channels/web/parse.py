"""Parsing the web channel's POST body (pure: no I/O)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import datetime

from channels.base import ChannelMessage, ChannelType, Conversation
from errors import ChannelPayloadError, RejectedRequestError

ID_PATTERN = re.compile(r"[A-Za-z0-9._:@+-]{1,200}")
# A web user id never contains ':' (the separator of namespaced message ids).
USER_PATTERN = re.compile(r"[A-Za-z0-9._@+-]{1,200}")


def namespaced_id(user_id: str, message_id: str) -> str:
    """Web message ids are chosen by clients: scope them to the user so users never collide."""
    return f"{user_id}:{message_id}"


def parse_web_message(
    body: object, *, user_id: str, now: datetime, max_text_chars: int
) -> ChannelMessage:
    """The `ChannelMessage` for a POST body from `user_id`; raises `ChannelPayloadError`."""
    if not isinstance(body, dict):
        raise ChannelPayloadError("the body must be a JSON object")
    if not USER_PATTERN.fullmatch(user_id):
        raise ChannelPayloadError("a web user id is letters, digits and . _ @ + - only")
    unknown = sorted(set(body) - {"user", "text", "thread_id", "message_id"})
    if unknown:
        raise ChannelPayloadError(f"unknown field(s): {', '.join(unknown)}")
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ChannelPayloadError("'text' must be a non-empty string")
    if len(text) > max_text_chars:
        raise RejectedRequestError(413, f"'text' is longer than {max_text_chars} characters")
    thread_id = _optional_id(body, "thread_id")
    message_id = _optional_id(body, "message_id") or uuid.uuid4().hex
    return ChannelMessage(
        channel_type=ChannelType.WEB,
        channel_id=user_id,
        message_id=namespaced_id(user_id, message_id),
        user_identifier=user_id,
        content=text,
        timestamp=now,
        thread_id=thread_id or "",
        reply_context={"client_message_id": message_id},
        conversation=Conversation.DIRECT,  # the user's own feed
        raw=dict(body),
    )


def _optional_id(body: Mapping[str, object], field: str) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise ChannelPayloadError(
            f"'{field}' must be 1-200 characters of letters, digits and . _ : @ + -"
        )
    return value
