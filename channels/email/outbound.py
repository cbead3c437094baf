"""Replies by mail: composing them (threaded, plain text plus simple HTML) and sending them
over SMTP (aiosmtplib), with SMTP failures mapped to the outbox's retry rules.

Our Message-ID is derived from the outbox row's id and our domain (`outbound_message_id`), so a
send retried after a crash carries the same id and the recipient's client sees one message; it
is returned as the receipt's platform id, which is how replies to it find their session.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any

import aiosmtplib

from channels.base import OutboundMessage
from channels.email.headers import normalize_id
from errors import DeliveryError

MAX_REFERENCES = 20
SEND_TIMEOUT = 30.0
_SAFE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_REPLY_PREFIX = re.compile(r"^\s*re\s*:", re.I)


@dataclass(frozen=True, slots=True)
class SmtpRelay:
    """Where replies are sent through."""

    host: str
    port: int
    starttls: bool = False
    username: str = ""
    password: str = ""


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
