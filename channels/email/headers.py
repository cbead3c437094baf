"""Reading mail headers without trusting them to be well formed.

Header values are read raw and decoded here (RFC 2047 words, stray 8-bit bytes as UTF-8 or
Windows-1252), with sizes capped, because the standard library's structured header parser can
raise, recurse deeply or take quadratic time on hostile input. Message ids have one normal
form everywhere (`normalize_id`): the text between the angle brackets, without whitespace.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email import errors, policy
from email.header import decode_header, make_header
from email.message import EmailMessage, Message
from email.parser import BytesParser
from email.utils import getaddresses, parsedate_to_datetime

MAX_HEADER_CHARS = 8_000  # longer header values are cut before they are parsed
MAX_REFERENCES = 30  # a long thread keeps its root and its latest ids
_ANGLE_ID = re.compile(r"<([^<>\s]{1,500})>")
_BARE_ID = re.compile(r"[^<>\s,;]{1,500}@[^<>\s,;]{1,500}")
_ADDRESS = re.compile(r"[^@\s<>()\[\],;:\"]{1,200}@[\w.-]{1,253}\.[\w-]{1,63}")


def read_headers(data: bytes) -> EmailMessage | None:
    """The message with only its header block parsed, or None when that is unreadable."""
    try:
        return BytesParser(policy=policy.default).parsebytes(data, headersonly=True)
    except (errors.MessageError, LookupError, ValueError, TypeError, IndexError, RecursionError):
        return None


def raw(message: Message, name: str) -> str:
    """The first `name` header as readable text ('' when absent): encoded words decoded,
    folding undone."""
    for key, value in message.raw_items():
        if key.lower() == name.lower():
            return clean(_decode_words(_text(value)))
    return ""


def raw_all(message: Message, name: str) -> list[str]:
    """Every `name` header's raw value (encoded words left as they are), in order."""
    return [_text(value) for key, value in message.raw_items() if key.lower() == name.lower()]


def clean(value: str) -> str:
    """One line of printable text."""
    value = re.sub(r"[\r\n\t]+", " ", value)
    return "".join(char for char in value if char.isprintable()).strip()


def _text(value: object) -> str:
    """A raw header value as str: bytes the parser smuggled in as surrogates are decoded."""
    text = str(value)[:MAX_HEADER_CHARS]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "surrogateescape")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("cp1252", "replace")
    return text


def _decode_words(value: str) -> str:
    try:
        return str(make_header(decode_header(value)))
    except (LookupError, UnicodeError, ValueError, TypeError, IndexError, AttributeError):
        return value


def subject(message: Message) -> str:
    """The Subject, decoded ('' when absent)."""
    return raw(message, "Subject")


def sender(message: Message) -> tuple[str, str] | None:
    """(address, display name) of the first From mailbox, or None when there is none."""
    for value in raw_all(message, "From"):
        for name, address in _addresses(value):
            return address, clean(_decode_words(name))
    return None


def first_recipient(message: Message) -> str | None:
    """The first To (else Cc) address."""
    for field_name in ("To", "Cc"):
        for value in raw_all(message, field_name):
            for _name, address in _addresses(value):
                return address
    return None


def recipients(message: Message) -> list[str]:
    """Every To and Cc address, lowercased."""
    found: list[str] = []
    for field_name in ("To", "Cc"):
        for value in raw_all(message, field_name):
            found.extend(address.lower() for _name, address in _addresses(value))
    return found


def _addresses(value: str) -> list[tuple[str, str]]:
    """The mailboxes in an address header; addresses that do not look like one are dropped."""
    try:
        pairs = getaddresses([value])
    except (ValueError, TypeError, IndexError, AttributeError, RecursionError):
        pairs = []
    found = [(name, address.strip()) for name, address in pairs if _ADDRESS.fullmatch(address)]
    if not found:  # getaddresses gives up on some real-world syntax: fall back to a scan
        found = [("", match) for match in _ADDRESS.findall(value)]
    return found


def normalize_id(value: str) -> str:
    """A message id in the one form used everywhere: no angle brackets, no whitespace."""
    match = _ANGLE_ID.search(value)
    return match.group(1) if match else re.sub(r"[\s<>]", "", value)[:500]


def _ids(value: str) -> list[str]:
    found = _ANGLE_ID.findall(value)
    return found or _BARE_ID.findall(value)


def message_id(message: Message) -> str | None:
    """The Message-ID in normal form, or None when the message has none."""
    for value in raw_all(message, "Message-ID"):
        ids = _ids(value)
        if ids:
            return ids[0]
        if value.strip():
            return normalize_id(value) or None
    return None


def in_reply_to(message: Message) -> tuple[str, ...]:
    """The ids in In-Reply-To."""
    found = (_id for value in raw_all(message, "In-Reply-To") for _id in _ids(value))
    return tuple(dict.fromkeys(found))


def references(message: Message) -> tuple[str, ...]:
    """The ids in References (root first), or In-Reply-To's when References is missing; at most
    `MAX_REFERENCES` (the root and the latest)."""
    found = [_id for value in raw_all(message, "References") for _id in _ids(value)]
    if not found:
        return in_reply_to(message)
    unique = list(dict.fromkeys(found))
    if len(unique) > MAX_REFERENCES:
        unique = [unique[0], *unique[-(MAX_REFERENCES - 1) :]]
    return tuple(unique)


def date(message: Message) -> datetime | None:
    """The Date header as an aware UTC datetime, or None when missing or unreadable."""
    value = raw(message, "Date")
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (ValueError, TypeError, IndexError, OverflowError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)
