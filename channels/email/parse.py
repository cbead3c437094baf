"""Raw mail (RFC 5322 bytes) to the `ChannelMessage` the gateway routes. Pure: no I/O, no clock.

`parse_email` reads the message with the standard library (`policy.default`), picks the text
(text/plain, else HTML through inscriptis), finds what the person forwarded (an attached
message first, then an inline forward, `channels.email.forward`), and strips what a reply
quotes (`channels.email.quote`; forwards are found first, since stripping would delete them).
Ids (Message-ID, In-Reply-To, References) are kept in one normal form everywhere: without angle
brackets or whitespace (`normalize_id`). Malformed mail either still yields a message (broken
boundaries, wrong charsets, HTML only, empty body) or raises `ChannelPayloadError` with the
reason (no sender, not mail at all); any other failure inside the standard library's parser
is turned into that error too, so callers never see a traceback.
"""

from __future__ import annotations

import base64
import binascii
import email.errors
import hashlib
import quopri
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import policy
from email.message import EmailMessage, Message
from email.parser import BytesParser
from textwrap import dedent
from typing import Any

from channels.base import (
    Attachment,
    ChannelMessage,
    ChannelType,
    Conversation,
    ForwardedContent,
)
from channels.email import headers
from channels.email.forward import read_forward
from channels.email.headers import normalize_id
from channels.email.html_text import HtmlError, html_to_text
from channels.email.quote import strip_reply
from errors import ChannelPayloadError

__all__ = ["MailText", "normalize_id", "parse_email", "references_of"]

MAX_TEXT_CHARS = 100_000  # what the assistant can use of one mail; the rest is cut
MAX_LINE_CHARS = 1_000  # longer lines are wrapped: the text patterns backtrack on long lines
MAX_ATTACHMENTS = 100
MAX_NESTING = 3  # attached messages inside attached messages
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# What the standard library's parser raises on inputs it does not expect (header parsing
# recursion on nested comments, odd parameter values …): reported as a payload error.
_PARSER_FAILURES = (
    email.errors.MessageError,
    LookupError,
    ValueError,
    TypeError,
    AttributeError,
    IndexError,
    RecursionError,
    UnicodeError,
    HtmlError,
)


@dataclass(frozen=True, slots=True)
class MailText:
    """The readable text of one message: the plain text (or HTML converted), and the same
    without quoted HTML replies (equal to `text` when the body is plain text)."""

    text: str
    unquoted: str
    attachments: tuple[Attachment, ...] = ()
    attached_messages: tuple[EmailMessage, ...] = field(default=())


def references_of(data: bytes) -> tuple[str, ...]:
    """The ids a message answers (In-Reply-To and References), read from its headers only, so
    the caller can look up the texts of our own messages before `parse_email`."""
    message = headers.read_headers(data)
    if message is None:
        return ()
    return tuple(dict.fromkeys((*headers.in_reply_to(message), *headers.references(message))))


def parse_email(
    data: bytes,
    *,
    own_texts: Sequence[str] = (),
    recipient: str | None = None,
    received_at: datetime | None = None,
) -> ChannelMessage:
    """The message in `data`; `own_texts` are the texts of our replies it answers (removed
    wherever quoted), `recipient` the assistant address it was delivered to (default: the
    first To/Cc address), `received_at` the receipt time (default: its Date header).

    Raises `ChannelPayloadError` with a reason when the mail cannot be routed."""
    if not data.strip():
        raise ChannelPayloadError("the message is empty")
    try:
        return _parse(data, own_texts, recipient, received_at)
    except _PARSER_FAILURES as exc:
        raise ChannelPayloadError(f"unreadable message ({type(exc).__name__}: {exc})") from exc


def _parse(
    data: bytes,
    own_texts: Sequence[str],
    recipient: str | None,
    received_at: datetime | None,
) -> ChannelMessage:
    message = BytesParser(policy=policy.default).parsebytes(data)
    sender = headers.sender(message)
    if sender is None:
        raise ChannelPayloadError("the message has no valid From address")
    address, name = sender
    subject = headers.subject(message)
    message_id = headers.message_id(message) or _hash_id(data)
    references = headers.references(message)
    in_reply_to = headers.in_reply_to(message)
    body = read_text(message)
    note, forwarded = _split_forward(body, subject)
    content = strip_reply(note, own_texts=own_texts)
    to_address = (recipient or headers.first_recipient(message) or "").lower()
    return ChannelMessage(
        channel_type=ChannelType.EMAIL,
        channel_id=to_address,
        message_id=message_id,
        user_identifier=address.lower(),
        content=content,
        timestamp=received_at or headers.date(message) or EPOCH,
        thread_id=(references or in_reply_to or (message_id,))[0],
        attachments=body.attachments,
        forwarded=forwarded,
        reply_context={
            "subject": subject,
            "reply_to": address,
            "reply_to_name": name,
            "from": to_address,
            "message_id": message_id,
            "references": list(references or in_reply_to),
        },
        raw=_raw_summary(message, data, message_id, references, in_reply_to),
        conversation=Conversation.DIRECT,  # the reply goes to the sender alone
        subject=subject,
        references=tuple(dict.fromkeys((*in_reply_to, *references))),
    )


def _split_forward(body: MailText, subject: str) -> tuple[str, ForwardedContent | None]:
    """(the person's own text, what they forwarded): an attached message wins over an inline
    forward; only a forward that was actually found (not just a "Fwd:" subject) counts."""
    for attached in body.attached_messages:
        forwarded = _attached_forward(attached)
        if forwarded is not None:
            return body.unquoted, forwarded
    found = read_forward(body.text, subject)
    if not found.forwarded or found.body is None:
        return body.unquoted, None
    sender = found.sender
    return found.message or "", ForwardedContent(
        sender=(sender.address or "").lower(),
        sender_name=sender.name or "",
        subject=found.subject or "",
        date=found.date or "",
        body=found.body,
    )


def _attached_forward(message: EmailMessage) -> ForwardedContent | None:
    sender = headers.sender(message)
    text = read_text(message, depth=MAX_NESTING)
    if sender is None and not text.text.strip():
        return None
    address, name = sender or ("", "")
    date = headers.raw(message, "Date")
    return ForwardedContent(
        sender=address.lower(),
        sender_name=name,
        subject=headers.subject(message),
        date=date,
        body=text.text.strip(),
    )


def read_text(message: EmailMessage, *, depth: int = 0) -> MailText:
    """The text, attachments and attached messages of `message`."""
    body = _body_part(message)
    alternatives = _alternatives_of(message, body)
    text = unquoted = ""
    if body is not None:
        decoded = decode_part(body)
        if body.get_content_type() == "text/html":
            text = dedent(html_to_text(decoded))
            unquoted = dedent(html_to_text(decoded, drop_quotes=True))
        else:
            text = unquoted = decoded
    attachments: list[Attachment] = []
    attached: list[EmailMessage] = []
    for part in _leaves(message):
        if part is body or part in alternatives:
            continue
        if part.get_content_type() == "message/rfc822":
            inner = _attached_message(part)
            if inner is not None and depth < MAX_NESTING:
                attached.append(inner)
        if len(attachments) < MAX_ATTACHMENTS:
            attachments.append(_attachment(part))
    return MailText(bound(text), bound(unquoted), tuple(attachments), tuple(attached))


def _body_part(message: EmailMessage) -> EmailMessage | None:
    """The text/plain body, unless it is blank and an HTML alternative exists."""
    plain = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    if isinstance(plain, EmailMessage) and (
        html is None or decode_part(plain).strip() or not isinstance(html, EmailMessage)
    ):
        return plain
    return html if isinstance(html, EmailMessage) else None


def _alternatives_of(message: EmailMessage, body: EmailMessage | None) -> list[Message]:
    """The other renderings of the body (its multipart/alternative siblings)."""
    if body is None:
        return []
    for part in message.walk():
        if part.get_content_type() == "multipart/alternative":
            children = part.get_payload()
            if isinstance(children, list) and any(child is body for child in children):
                return [c for c in children if isinstance(c, Message) and c is not body]
    return []


def _leaves(message: Message) -> Iterator[Message]:
    """The non-multipart parts, not descending into attached messages."""
    if message.get_content_maintype() == "multipart":
        children = message.get_payload()
        for child in children if isinstance(children, list) else ():
            if isinstance(child, Message):
                yield from _leaves(child)
    elif message is not None:
        yield message


def _attached_message(part: Message) -> EmailMessage | None:
    """The message inside a message/rfc822 part, also when it was (wrongly, but commonly)
    base64- or quoted-printable-encoded, which the standard library does not undo."""
    payload = part.get_payload()
    inner = payload[0] if isinstance(payload, list) and payload else None
    if not isinstance(inner, Message):
        return None
    encoding = str(part.get("Content-Transfer-Encoding", "")).strip().lower()
    if encoding not in ("base64", "quoted-printable"):
        return inner if isinstance(inner, EmailMessage) else None
    encoded = inner.as_bytes()
    try:
        raw = base64.b64decode(encoded) if encoding == "base64" else quopri.decodestring(encoded)
    except (binascii.Error, ValueError):
        return None
    return BytesParser(policy=policy.default).parsebytes(raw)


def _attachment(part: Message) -> Attachment:
    payload = part.get_payload(decode=True)
    size = len(payload) if isinstance(payload, bytes) else len(str(part.get_payload()))
    filename = part.get_filename()
    if not filename and part.get_content_type() == "message/rfc822":
        filename = "forwarded-message.eml"
    return Attachment(
        filename=headers.clean(filename or "unnamed"),
        content_type=part.get_content_type(),
        size=size,
    )


def decode_part(part: Message) -> str:
    """A text part's content: its declared charset when that decodes, else UTF-8, else
    Windows-1252 (8-bit mail that declares nothing usually is one of these two)."""
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return ""
    return decode_bytes(payload, part.get_content_charset())


_LATIN = {None, "us-ascii", "ascii", "iso-8859-1", "latin-1", "latin1", "windows-1252", "cp1252"}


def decode_bytes(data: bytes, charset: str | None) -> str:
    """`data` as text; never raises."""
    candidates: list[str] = []
    # Valid UTF-8 is almost never Latin-1 text by accident: mislabelled UTF-8 is common.
    if charset in _LATIN:
        candidates.append("utf-8")
    if charset:
        candidates.append(charset)
    candidates += ["utf-8", "cp1252"]
    for candidate in candidates:
        try:
            return data.decode(candidate)
        except (LookupError, UnicodeDecodeError, ValueError, TypeError):
            continue
    return data.decode("latin-1")


def bound(text: str) -> str:
    """`text` made safe for the text patterns, which backtrack: at most `MAX_TEXT_CHARS`, lines
    over `MAX_LINE_CHARS` wrapped (at a space where there is one), runs of spaces and of blank
    lines shortened. What a person reads is unchanged in all but absurd mail."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    text = _SPACE_RUN.sub(" " * 8, text)
    text = _BLANK_RUN.sub("\n\n\n", text)
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS] + "\n[… message truncated]"
    lines = [line.rstrip() for line in text.split("\n")]
    return "\n".join(piece for line in lines for piece in _wrap(line))


_SPACE_RUN = re.compile(r"[ \t\u00a0]{9,}")
_BLANK_RUN = re.compile(r"\n[ \t]*(?:\n[ \t]*){3,}")


def _wrap(line: str) -> Iterator[str]:
    while len(line) > MAX_LINE_CHARS:
        cut = line.rfind(" ", 0, MAX_LINE_CHARS)
        cut = cut if cut > 0 else MAX_LINE_CHARS
        yield line[:cut]
        line = line[cut:].lstrip(" ")
    yield line


def _hash_id(data: bytes) -> str:
    """A stable id for mail without a Message-ID: the same mail retried gets the same id. The
    trace headers (Received …) that relays add on the way are left out."""
    head, _, body = data.replace(b"\r\n", b"\n").partition(b"\n\n")
    kept = [
        line
        for line in re.split(rb"\n(?![ \t])", head)
        if line.split(b":", 1)[0].strip().lower() in (b"from", b"to", b"cc", b"date", b"subject")
    ]
    digest = hashlib.sha256(b"\n".join(sorted(kept)) + b"\n\n" + body).hexdigest()
    return f"sha256.{digest[:40]}@message-id.invalid"


def _raw_summary(
    message: EmailMessage,
    data: bytes,
    message_id: str,
    references: Sequence[str],
    in_reply_to: Sequence[str],
) -> dict[str, Any]:
    """What is kept for audit: the routing headers and the size, not the body."""
    return {
        "size": len(data),
        "headers": {
            "from": headers.raw(message, "From"),
            "to": headers.raw(message, "To"),
            "cc": headers.raw(message, "Cc"),
            "subject": headers.subject(message),
            "date": headers.raw(message, "Date"),
            "message_id": message_id,
            "in_reply_to": list(in_reply_to),
            "references": list(references),
            "auto_submitted": headers.raw(message, "Auto-Submitted"),
            "precedence": headers.raw(message, "Precedence"),
        },
        "defects": sorted({type(defect).__name__ for defect in message.defects})[:10],
    }
