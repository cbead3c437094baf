"""Replies by mail: composing them (threaded, plain text plus simple HTML) and handing them to
a `ReplyTransport`: an SMTP relay (aiosmtplib), with SMTP failures mapped to the outbox's retry
rules, or a folder that receives each reply as an ``.eml`` file (development: nothing leaves
the machine, and every reply can be read).

Our Message-ID is derived from the outbox row's id and our domain (`outbound_message_id`), so a
send retried after a crash carries the same id and the recipient's client sees one message; it
is returned as the receipt's platform id, which is how replies to it find their session.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime
from pathlib import Path
from typing import Any, Protocol

import aiosmtplib

from channels.base import OutboundMessage
from channels.email.headers import normalize_id
from errors import DeliveryError
from primitives.durable_file import write_durably

MAX_REFERENCES = 20
SEND_TIMEOUT = 30.0
_SAFE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_REPLY_PREFIX = re.compile(r"^\s*re\s*:", re.I)
_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._@-]")


class ReplyTransport(Protocol):
    """Where a composed reply goes: `SmtpRelay` or `ReplyFolder`."""

    async def deliver(self, mail: EmailMessage, *, sender: str, recipient: str) -> str:
        """Hand `mail` over for `recipient`; where it went (for the log). Raises
        `DeliveryError` (`permanent` when retrying cannot help)."""
        ...


@dataclass(frozen=True, slots=True)
class SmtpRelay:
    """The SMTP server replies are sent through."""

    host: str
    port: int
    starttls: bool = False
    username: str = ""
    password: str = ""

    async def deliver(self, mail: EmailMessage, *, sender: str, recipient: str) -> str:
        """Send `mail` through this relay (see `deliver`); ``host:port``."""
        await deliver(mail, self, sender=sender, recipient=recipient)
        return f"{self.host}:{self.port}"


def domain_of(address: str) -> str:
    """The domain part of an address."""
    return address.rpartition("@")[2].lower() or "localhost"


def outbound_message_id(outbound_id: str, domain: str) -> str:
    """Our Message-ID (normal form, no brackets) for the outbox row `outbound_id`: the same row
    always gets the same id."""
    local = outbound_id if _SAFE_ID.fullmatch(outbound_id) else _digest(outbound_id)
    return f"reply.{local}@{domain}"


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def reply_subject(subject: str) -> str:
    """``Re: subject``, without stacking prefixes."""
    subject = subject.strip()
    if _REPLY_PREFIX.match(subject):
        return subject
    return f"Re: {subject}" if subject else "Re: your message"


def compose_reply(
    message: OutboundMessage, *, our_address: str, now: datetime
) -> tuple[EmailMessage, str]:
    """(the reply as a mail, our Message-ID in normal form); raises `DeliveryError`
    (permanent) when the reply context does not say whom to answer."""
    context: Mapping[str, Any] = message.reply_context
    recipient = str(context.get("reply_to") or "")
    if "@" not in recipient:
        raise DeliveryError("the reply context has no address to answer", permanent=True)
    our_id = outbound_message_id(message.message_id, domain_of(our_address))
    answered = normalize_id(str(context.get("message_id") or message.in_reply_to or ""))
    thread = [normalize_id(str(item)) for item in context.get("references") or ()]
    references = _references([*thread, answered])
    mail = EmailMessage()
    mail["From"] = our_address
    mail["To"] = _mailbox(recipient, str(context.get("reply_to_name") or ""))
    mail["Subject"] = reply_subject(str(context.get("subject") or ""))
    mail["Date"] = format_datetime(now)
    mail["Message-ID"] = f"<{our_id}>"
    if answered:
        mail["In-Reply-To"] = f"<{answered}>"
    if references:
        mail["References"] = " ".join(f"<{item}>" for item in references)
    # RFC 3834: a generated answer, so auto-responders do not answer it back.
    mail["Auto-Submitted"] = "auto-replied"
    mail.set_content(message.content)
    mail.add_alternative(reply_html(message.content), subtype="html")
    if message.file is not None:
        maintype, _, subtype = message.file.content_type.partition("/")
        mail.add_attachment(
            message.file.content.encode(),
            maintype=maintype or "application",
            subtype=subtype or "octet-stream",
            filename=message.file.filename,
        )
    return mail, our_id


def _mailbox(address: str, name: str) -> Address | str:
    local, _, domain = address.rpartition("@")
    try:
        return Address(display_name=name, username=local, domain=domain)
    except (ValueError, IndexError):
        return address


def _references(ids: Sequence[str]) -> list[str]:
    unique = [item for item in dict.fromkeys(ids) if item]
    if len(unique) > MAX_REFERENCES:  # keep the root and the latest ones (RFC 5322 §3.6.4)
        unique = [unique[0], *unique[-(MAX_REFERENCES - 1) :]]
    return unique


def reply_html(text: str) -> str:
    """A simple HTML rendering: paragraphs and line breaks, text escaped."""
    paragraphs = [part for part in re.split(r"\n\s*\n", text.strip()) if part.strip()]
    body = "\n".join(
        "<p>" + "<br>\n".join(html.escape(line) for line in part.split("\n")) + "</p>"
        for part in paragraphs
    )
    style = "font-family: sans-serif"
    return f'<!DOCTYPE html>\n<html><body style="{style}">\n{body}\n</body></html>\n'


async def deliver(mail: EmailMessage, relay: SmtpRelay, *, sender: str, recipient: str) -> None:
    """Send `mail` through `relay`; raises `DeliveryError`: 4xx and connection trouble are
    retryable, 5xx is permanent."""
    try:
        await aiosmtplib.send(
            mail,
            sender=sender,
            recipients=[recipient],
            hostname=relay.host,
            port=relay.port,
            username=relay.username or None,
            password=relay.password or None,
            start_tls=relay.starttls,
            local_hostname=domain_of(sender),  # not getfqdn(): that may block on DNS
            timeout=SEND_TIMEOUT,
        )
    except aiosmtplib.SMTPRecipientsRefused as exc:
        codes = [refused.code for refused in exc.recipients]
        raise _by_code(min(codes, default=550), "the relay refused the recipient") from exc
    except aiosmtplib.SMTPResponseException as exc:
        raise _by_code(exc.code, f"the relay answered {exc.code}") from exc
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        raise DeliveryError(f"SMTP relay unreachable: {type(exc).__name__}") from exc


def _by_code(code: int, reason: str) -> DeliveryError:
    return DeliveryError(f"{reason} ({code})", permanent=500 <= code < 600)


@dataclass(frozen=True, slots=True)
class ReplyFolder:
    """A folder that receives each reply as ``<UTC time>-<Message-ID>.eml`` (outbound
    ``mode: files``): the mail the relay would get, with the envelope on top as
    ``Return-Path`` and ``X-Original-To``, the way a mailbox stores it."""

    directory: Path

    async def deliver(self, mail: EmailMessage, *, sender: str, recipient: str) -> str:
        """Write `mail` atomically (a hidden temporary file, then a rename) in a worker thread,
        creating the folder; the file's path. An `OSError` is a retryable `DeliveryError`."""
        envelope = (
            f"Return-Path: <{_one_line(sender)}>\r\nX-Original-To: {_one_line(recipient)}\r\n"
        )
        try:
            path = await asyncio.to_thread(self._write, mail, envelope.encode())
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise DeliveryError(f"cannot write the reply to {self.directory}: {reason}") from exc
        return str(path)

    async def check(self) -> str:
        """Create the folder, then write and remove a probe file there (`gateway doctor`);
        raises `OSError` when that fails."""
        await asyncio.to_thread(self._probe)
        return f"writes replies to {self.directory}"

    def _write(self, mail: EmailMessage, envelope: bytes) -> Path:
        # The SMTP policy: CRLF line ends and encoded headers, the bytes a relay would get.
        data = envelope + mail.as_bytes(policy=policy.SMTP)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")  # sorts in writing order
        message_id = _UNSAFE_FILENAME.sub("_", normalize_id(str(mail["Message-ID"] or "")))
        path = self.directory / f"{stamp}-{message_id[:120] or 'reply'}.eml"
        # Hidden in the same folder until renamed: readers of *.eml never see half a reply.
        write_durably(path, data, temp_prefix=".")
        return path

    def _probe(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=self.directory, prefix=".probe-")
        try:
            os.write(handle, b"probe\r\n")
        finally:
            os.close(handle)
            os.unlink(probe)


def _one_line(value: str) -> str:
    return " ".join(value.split())
