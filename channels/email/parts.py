"""The bytes of a mail's attachments, for the gateway's file stash.

The same parts `parse.read_text` names (every leaf that is neither the body nor one of its
alternative renderings), and also the attachments inside attached messages (a forwarded mail
carries the invoice inside its `message/rfc822` part), down to `MAX_NESTING` levels. An
attached message is itself a file too (`forwarded-message.eml`), read as a mail.
"""

from __future__ import annotations

from email import policy
from email.message import EmailMessage
from email.parser import BytesParser

from channels.base import Attachment
from channels.email.parse import (
    MAX_ATTACHMENTS,
    MAX_NESTING,
    _alternatives_of,
    _attached_message,
    _attachment,
    _body_part,
    _leaves,
)


def attachment_parts(data: bytes) -> list[tuple[Attachment, bytes]]:
    """Each attachment of the mail with its decoded bytes, outermost first."""
    found: list[tuple[Attachment, bytes]] = []
    _collect(BytesParser(policy=policy.default).parsebytes(data), found, depth=0)
    return found


def _collect(message: EmailMessage, found: list[tuple[Attachment, bytes]], depth: int) -> None:
    body = _body_part(message)
    alternatives = _alternatives_of(message, body)
    for part in _leaves(message):
        if part is body or any(part is other for other in alternatives):
            continue
        if len(found) >= MAX_ATTACHMENTS:
            return
        if part.get_content_type() == "message/rfc822":
            inner = _attached_message(part)
            if inner is None:
                continue
            found.append((_attachment(part), inner.as_bytes()))
            if depth < MAX_NESTING:
                _collect(inner, found, depth + 1)
            continue
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes):
            found.append((_attachment(part), payload))
