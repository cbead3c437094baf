"""Parsing the web channel's requests (pure: no I/O): the POST body, JSON or the fields of a
form with files, and the cursor and limit of the GET queries."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime

from channels.base import Attachment, ChannelMessage, ChannelType, Conversation
from errors import ChannelPayloadError, RejectedRequestError

ID_PATTERN = re.compile(r"[A-Za-z0-9._:@+-]{1,200}")
# A web user id never contains ':' (the separator of namespaced message ids).
USER_PATTERN = re.compile(r"[A-Za-z0-9._@+-]{1,200}")


def namespaced_id(user_id: str, message_id: str) -> str:
    """Web message ids are chosen by clients: scope them to the user so users never collide."""
    return f"{user_id}:{message_id}"


def parse_web_message(
    body: object,
    *,
    user_id: str,
    now: datetime,
    max_text_chars: int,
    attachments: Sequence[Attachment] = (),
) -> ChannelMessage:
    """The `ChannelMessage` for a POST body from `user_id`, with the files sent beside it
    (`text` may then be empty); raises `ChannelPayloadError`."""
    if not isinstance(body, dict):
        raise ChannelPayloadError("the body must be a JSON object")
    if not USER_PATTERN.fullmatch(user_id):
        raise ChannelPayloadError("a web user id is letters, digits and . _ @ + - only")
    unknown = sorted(set(body) - {"user", "text", "thread_id", "message_id"})
    if unknown:
        raise ChannelPayloadError(f"unknown field(s): {', '.join(unknown)}")
    text = body.get("text", "" if attachments else None)
    if not isinstance(text, str) or not (text.strip() or attachments):
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
        attachments=tuple(attachments),
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


def parse_cursor(value: str | None) -> int:
    """A feed cursor from the query (`after`, `Last-Event-ID`): 0 when absent."""
    if value in (None, ""):
        return 0
    if not value.isdigit():
        raise ChannelPayloadError("'after' must be a cursor returned by this API")
    return int(value)


def parse_limit(value: str | None) -> int:
    """How many messages a page may hold (`limit`): 100 when absent, at most 500."""
    if value in (None, ""):
        return 100
    if not value.isdigit() or not 1 <= int(value) <= 500:
        raise ChannelPayloadError("'limit' must be a number from 1 to 500")
    return int(value)
