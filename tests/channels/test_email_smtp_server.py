"""The email channel over real SMTP on loopback: mail sent with smtplib/aiosmtplib to the
running server reaches the inbox (or gets a clear SMTP answer); replies sent by `send()` arrive
at an aiosmtpd sink with threading headers; a reply to a reply continues the thread."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import smtplib
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import aiosmtplib
import dkim
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from channels.base import AcceptResult, ChannelMessage, ChannelType, OutboundMessage
from channels.email.adapter import EmailChannel, EmailSettings
from channels.email.auth import DnsTemporaryError
from errors import DeliveryError, StorageError
from tests.fakes.smtp_sink import SmtpSink

ASSISTANT = "assistant@acme.example"
NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)


@dataclass
class MemoryInbox:
    """Commits in memory, dedupes on message id, or fails as told."""

    messages: list[ChannelMessage] = field(default_factory=list)
    failure: Exception | None = None

    async def accept(self, message: ChannelMessage) -> AcceptResult:
        if self.failure is not None:
            raise self.failure
        duplicate = any(seen.message_id == message.message_id for seen in self.messages)
        if not duplicate:
            self.messages.append(message)
        return AcceptResult(accepted=not duplicate, message_id=message.message_id)


@dataclass
class SentLog:
    """Our replies by id, as the gateway's outbox would answer."""

    texts_by_id: dict[str, str] = field(default_factory=dict)
    asked: list[list[str]] = field(default_factory=list)

    async def texts(self, message_ids: Sequence[str]) -> list[str]:
        self.asked.append(list(message_ids))
        return [self.texts_by_id[i] for i in message_ids if i in self.texts_by_id]


def settings(sink_port: int = 9, **overrides: Any) -> EmailSettings:
    values: dict[str, Any] = {
        "addresses": (ASSISTANT,),
        "listen_host": "127.0.0.1",
        "listen_port": 0,
        "max_message_bytes": 200_000,
        "auth_mode": "off",
        "trusted_authserv_id": None,
        "outbound_host": "127.0.0.1",
        "outbound_port": sink_port,
        "outbound_starttls": False,
        "outbound_username": "",
        "outbound_password": "",
    }
    values.update(overrides)
    return EmailSettings(**values)


@dataclass
class Harness:
    channel: EmailChannel
    inbox: MemoryInbox
    sent: SentLog
    rejected: list[tuple[int, str]]


@pytest.fixture
async def sink() -> AsyncIterator[SmtpSink]:
    server = SmtpSink()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def make_channel(sink: SmtpSink) -> AsyncIterator[Any]:
    started: list[EmailChannel] = []

    async def make(resolver: Any = None, **overrides: Any) -> Harness:
        inbox, sent, rejected = MemoryInbox(), SentLog(), []
        extra = {"resolver": resolver} if resolver is not None else {}
        channel = EmailChannel(
            settings(sink.port, **overrides),
            inbox,
            clock=lambda: NOW,
            sent=sent,
            on_rejected=lambda status, reason: rejected.append((status, reason)),
            **extra,
        )
        await channel.start()
        started.append(channel)
        return Harness(channel, inbox, sent, rejected)

    yield make
    for channel in started:
        await channel.stop()


def mail(
    body: str,
    *,
    subject: str = "Hello",
    sender: str = "Alice Example <alice@example.com>",
    message_id: str = "<m1@example.com>",
    **headers: str,
) -> bytes:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = ASSISTANT
    message["Subject"] = subject
    message["Message-ID"] = message_id
    message["Date"] = "Sat, 01 Mar 2025 10:00:00 +0000"
    for name, value in headers.items():
        message[name.replace("_", "-")] = value
    message.set_content(body)
    return message.as_bytes()


async def deliver(
    port: int, data: bytes, *, mail_from: str = "alice@example.com", to: str = ASSISTANT
) -> None:
    if not mail_from:  # a null reverse-path (bounces), which aiosmtplib will not send
        await asyncio.to_thread(_smtplib_send, port, data, mail_from="")
        return
    await aiosmtplib.send(
        data, sender=mail_from, recipients=[to], hostname="127.0.0.1", port=port, start_tls=False
    )


async def smtp_code(port: int, data: bytes, **kwargs: Any) -> int:
    """The SMTP code a delivery attempt ends with (250 when accepted)."""
    try:
        await deliver(port, data, **kwargs)
    except aiosmtplib.SMTPRecipientsRefused as exc:
        return exc.recipients[0].code
    except aiosmtplib.SMTPResponseException as exc:
        return exc.code
    except smtplib.SMTPResponseException as exc:
        return exc.smtp_code
    return 250


GMAIL_FORWARD = """Could you summarise this thread for me?

---------- Forwarded message ---------
From: Bob Builder <bob@example.org>
Date: Mon, Feb 3, 2025 at 9:00 AM
Subject: Budget 2025
To: Alice <alice@example.com>


The budget is 10k, split across four quarters.
"""

OUTLOOK_FORWARD = """Could you summarise this thread for me?

________________________________
From: Bob Builder <bob@example.org>
Sent: Monday, February 3, 2025 9:00 AM
To: Alice <alice@example.com>
Subject: Budget 2025

The budget is 10k, split across four quarters.
"""

APPLE_FORWARD = """Could you summarise this thread for me?

Begin forwarded message:

> From: Bob Builder <bob@example.org>
> Subject: Budget 2025
> Date: 3 February 2025 at 09:00:00 CET
> To: Alice <alice@example.com>
>
> The budget is 10k, split across four quarters.
"""


@pytest.mark.parametrize(
    ("body", "subject"),
    [
        (GMAIL_FORWARD, "Fwd: Budget 2025"),
        (OUTLOOK_FORWARD, "FW: Budget 2025"),
        (APPLE_FORWARD, "Fwd: Budget 2025"),
    ],
    ids=["gmail", "outlook", "apple-mail"],
)
async def test_a_forward_over_smtp_is_committed_then_acknowledged(
    make_channel: Any, body: str, subject: str
) -> None:
    h = await make_channel()
    await deliver(h.channel.port, mail(body, subject=subject))
    [message] = h.inbox.messages
    assert message.channel_type is ChannelType.EMAIL
    assert (message.user_identifier, message.channel_id) == ("alice@example.com", ASSISTANT)
    assert (message.message_id, message.thread_id, message.references) == (
        "m1@example.com",
        "m1@example.com",
        (),
    )
    assert message.content == "Could you summarise this thread for me?"
    assert message.forwarded is not None
    assert (message.forwarded.sender, message.forwarded.subject) == (
        "bob@example.org",
        "Budget 2025",
    )
    assert message.forwarded.body == "The budget is 10k, split across four quarters."
    assert message.timestamp == NOW
    assert message.raw["auth"]["mode"] == "off"


async def test_the_round_trip_forward_reply_and_reply_to_the_reply(
    make_channel: Any, sink: SmtpSink
) -> None:
    h = await make_channel()
    await asyncio.to_thread(
        _smtplib_send, h.channel.port, mail(GMAIL_FORWARD, subject="Fwd: Budget 2025")
    )
    [inbound] = h.inbox.messages

    answer = "The budget for 2025 is ten thousand, split evenly across the four quarters."
    outbound = OutboundMessage(
        message_id="out-7f3a",
        channel_type=ChannelType.EMAIL,
        channel_id=inbound.channel_id,
        content=answer,
        thread_id=inbound.thread_id,
        in_reply_to=inbound.message_id,
        reply_context=dict(inbound.reply_context),
    )
    receipt = await h.channel.send(outbound)
    [delivery] = await sink.wait_for(1)
    reply = delivery.message
    assert receipt.platform_message_id == "reply.out-7f3a@acme.example"
    assert reply["Message-ID"] == "<reply.out-7f3a@acme.example>"
    assert reply["In-Reply-To"] == "<m1@example.com>"
    assert reply["References"] == "<m1@example.com>"
    assert reply["Subject"] == "Re: Fwd: Budget 2025"
    assert reply["From"] == ASSISTANT
    assert reply["To"] == "Alice Example <alice@example.com>"
    assert reply["Auto-Submitted"] == "auto-replied"
    assert delivery.rcpt_tos == ["alice@example.com"]
    assert reply.get_body(preferencelist=("plain",)).get_content().strip() == answer
    assert "<p>The budget for 2025" in reply.get_body(preferencelist=("html",)).get_content()

    h.sent.texts_by_id[receipt.platform_message_id] = answer
    quoted = "\n".join(f"> {line}" for line in _wrap(answer))
    follow_up = mail(
        f"And what about 2026?\n\nOn Sat, 1 Mar 2025, {ASSISTANT} wrote:\n{quoted}\n",
        subject=str(reply["Subject"]),
        message_id="<m2@example.com>",
        In_Reply_To=str(reply["Message-ID"]),
        References=f"{reply['References']} {reply['Message-ID']}",
    )
    await deliver(h.channel.port, follow_up)
    second = h.inbox.messages[1]
    assert receipt.platform_message_id in second.references
    assert second.thread_id == inbound.thread_id  # the same thread: the root Message-ID
    assert second.content == "And what about 2026?"
    assert h.sent.asked == [["reply.out-7f3a@acme.example", "m1@example.com"]]


def _wrap(text: str, width: int = 40) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if len(line) + len(word) > width:
            lines.append(line.strip())
            line = ""
        line += word + " "
    return [*lines, line.strip()]


def _smtplib_send(port: int, data: bytes, mail_from: str = "alice@example.com") -> None:
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as client:
        client.sendmail(mail_from, [ASSISTANT], data)


async def test_a_retried_send_reuses_the_same_message_id(make_channel: Any, sink: SmtpSink) -> None:
    h = await make_channel()
    outbound = OutboundMessage(
        message_id="out-1",
        channel_type=ChannelType.EMAIL,
        channel_id=ASSISTANT,
        content="Hi",
        reply_context={"reply_to": "alice@example.com", "subject": "Q", "message_id": "m1@x"},
    )
    first = await h.channel.send(outbound)
    second = await h.channel.send(outbound)
    deliveries = await sink.wait_for(2)
    assert first == second
    assert deliveries[0].message["Message-ID"] == deliveries[1].message["Message-ID"]


@pytest.mark.parametrize(
    ("status", "permanent"), [("451 4.3.0 Try later", False), ("550 5.1.1 No such user", True)]
)
async def test_smtp_failures_map_to_retryable_or_permanent(
    make_channel: Any, sink: SmtpSink, status: str, permanent: bool
) -> None:
    h = await make_channel()
    sink.fail_next(status)
    outbound = OutboundMessage(
        message_id="out-2",
        channel_type=ChannelType.EMAIL,
        channel_id=ASSISTANT,
        content="Hi",
        reply_context={"reply_to": "alice@example.com"},
    )
    with pytest.raises(DeliveryError) as caught:
        await h.channel.send(outbound)
    assert caught.value.permanent is permanent


async def test_an_unreachable_relay_is_retryable(make_channel: Any) -> None:
    h = await make_channel(outbound_port=1)
    outbound = OutboundMessage(
        message_id="out-3",
        channel_type=ChannelType.EMAIL,
        channel_id=ASSISTANT,
        content="Hi",
        reply_context={"reply_to": "alice@example.com"},
    )
    with pytest.raises(DeliveryError) as caught:
        await h.channel.send(outbound)
    assert not caught.value.permanent


async def test_a_reply_without_an_address_to_answer_is_permanent(make_channel: Any) -> None:
    h = await make_channel()
    outbound = OutboundMessage(
        message_id="out-4", channel_type=ChannelType.EMAIL, channel_id=ASSISTANT, content="Hi"
    )
    with pytest.raises(DeliveryError) as caught:
        await h.channel.send(outbound)
    assert caught.value.permanent


async def test_other_recipients_are_refused_with_550(make_channel: Any) -> None:
    h = await make_channel()
    assert await smtp_code(h.channel.port, mail("Hi"), to="someone@acme.example") == 550
    assert h.inbox.messages == []
    assert h.rejected[0][0] == 550


async def test_oversized_mail_is_refused_with_552(make_channel: Any) -> None:
    h = await make_channel(max_message_bytes=5_000)
    assert await smtp_code(h.channel.port, mail("x" * 10_000)) == 552
    assert h.inbox.messages == []


async def test_a_storage_failure_answers_451_so_the_sender_retries(make_channel: Any) -> None:
    h = await make_channel()
    h.inbox.failure = StorageError("database unavailable")
    assert await smtp_code(h.channel.port, mail("Hi")) == 451
    h.inbox.failure = None
    assert await smtp_code(h.channel.port, mail("Hi")) == 250  # the retry succeeds
    assert len(h.inbox.messages) == 1


async def test_an_unexpected_error_answers_451(make_channel: Any) -> None:
    h = await make_channel()
    h.inbox.failure = RuntimeError("bug")
    assert await smtp_code(h.channel.port, mail("Hi")) == 451


async def test_a_redelivered_message_id_is_stored_once(make_channel: Any) -> None:
    h = await make_channel()
    assert await smtp_code(h.channel.port, mail("Hi")) == 250
    assert await smtp_code(h.channel.port, mail("Hi")) == 250
    assert len(h.inbox.messages) == 1


async def test_mail_without_a_sender_is_refused_with_a_reason(make_channel: Any) -> None:
    h = await make_channel()
    data = b"To: assistant@acme.example\r\nSubject: who?\r\n\r\nHi\r\n"
    assert await smtp_code(h.channel.port, data) == 550
    assert "From" in h.rejected[-1][1]


@pytest.mark.parametrize(
    ("data", "mail_from"),
    [
        (mail("Out of office", Auto_Submitted="auto-replied"), "alice@example.com"),
        (mail("Newsletter", Precedence="bulk"), "alice@example.com"),
        (mail("Undeliverable", sender="MAILER-DAEMON@example.com"), "mailer-daemon@example.com"),
        (mail("Loop", sender=ASSISTANT), ASSISTANT),
        (mail("Delivery report"), ""),
    ],
    ids=["auto-submitted", "bulk", "mailer-daemon", "own-address", "null-sender"],
)
async def test_automatic_mail_is_accepted_but_never_routed(
    make_channel: Any, data: bytes, mail_from: str
) -> None:
    h = await make_channel()
    assert await smtp_code(h.channel.port, data, mail_from=mail_from) == 250
    assert h.inbox.messages == []


async def test_auto_submitted_no_is_a_person(make_channel: Any) -> None:
    h = await make_channel()
    assert await smtp_code(h.channel.port, mail("Hi", Auto_Submitted="no")) == 250
    assert len(h.inbox.messages) == 1


async def test_a_sender_over_the_hourly_limit_is_asked_to_retry_later(make_channel: Any) -> None:
    h = await make_channel(replies_per_sender_per_hour=2)
    codes = [
        await smtp_code(h.channel.port, mail("Hi", message_id=f"<r{i}@example.com>"))
        for i in range(3)
    ]
    assert codes == [250, 250, 451]
    assert len(h.inbox.messages) == 2


# --- sender authentication over SMTP ----------------------------------------------------


@pytest.fixture(scope="module")
def dkim_key() -> tuple[bytes, str]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return pem, "v=DKIM1; k=rsa; p=" + base64.b64encode(public).decode()


def signed(data: bytes, pem: bytes, domain: str = "example.com") -> bytes:
    headers = [b"from", b"to", b"subject", b"message-id", b"date"]
    return bytes(dkim.sign(data, b"sel", domain.encode(), pem, include_headers=headers)) + data


@pytest.fixture
def resolver(dkim_key: tuple[bytes, str]) -> Any:
    records = {
        ("sel._domainkey.example.com", "TXT"): [dkim_key[1]],
        ("sel._domainkey.evil.example", "TXT"): [dkim_key[1]],
        ("_dmarc.example.com", "TXT"): ["v=DMARC1; p=reject"],
    }
    return lambda name, rdtype: records.get((name, rdtype), [])


async def test_verify_mode_routes_an_aligned_signed_mail(
    make_channel: Any, resolver: Any, dkim_key: tuple[bytes, str]
) -> None:
    h = await make_channel(resolver=resolver, auth_mode="verify")
    assert await smtp_code(h.channel.port, signed(mail("Hi"), dkim_key[0])) == 250
    [message] = h.inbox.messages
    assert message.raw["auth"]["dmarc"] == "pass"


@pytest.mark.parametrize("forgery", ["tampered-from", "misaligned", "unsigned"])
async def test_verify_mode_refuses_a_forged_sender(
    make_channel: Any, resolver: Any, dkim_key: tuple[bytes, str], forgery: str
) -> None:
    h = await make_channel(resolver=resolver, auth_mode="verify")
    if forgery == "tampered-from":
        data = signed(mail("Hi"), dkim_key[0]).replace(b"Alice Example", b"Alice Exampel")
    elif forgery == "misaligned":
        data = signed(mail("Hi"), dkim_key[0], domain="evil.example")
    else:
        data = mail("Hi")
    assert await smtp_code(h.channel.port, data) == 550
    assert h.inbox.messages == []
    assert h.rejected[-1][0] == 550


async def test_verify_mode_asks_to_retry_when_dns_fails(
    make_channel: Any, dkim_key: tuple[bytes, str]
) -> None:
    def broken(name: str, rdtype: str) -> list[str]:
        raise DnsTemporaryError(name)

    h = await make_channel(resolver=broken, auth_mode="verify")
    assert await smtp_code(h.channel.port, signed(mail("Hi"), dkim_key[0])) == 451
    assert h.inbox.messages == []


async def test_trusted_mta_mode_drops_unauthenticated_mail_without_bouncing(
    make_channel: Any,
) -> None:
    h = await make_channel(auth_mode="trusted_mta", trusted_authserv_id="mx.acme.example")
    failing = b"Authentication-Results: mx.acme.example; dmarc=fail header.from=example.com\r\n"
    assert await smtp_code(h.channel.port, failing + mail("Hi")) == 250
    assert h.inbox.messages == []
    assert h.rejected == [(250, "mx.acme.example: dmarc=fail")]
    passing = b"Authentication-Results: mx.acme.example; dmarc=pass header.from=example.com\r\n"
    assert await smtp_code(h.channel.port, passing + mail("Hi", message_id="<m9@x>")) == 250
    assert len(h.inbox.messages) == 1


# --- STARTTLS ---------------------------------------------------------------------------


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_starttls_with_the_configured_certificate(make_channel: Any, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    h = await make_channel(tls_cert=cert, tls_key=key)
    context = ssl.create_default_context(cafile=str(cert))
    context.check_hostname = False
    await aiosmtplib.send(
        mail("Over TLS"),
        sender="alice@example.com",
        recipients=[ASSISTANT],
        hostname="127.0.0.1",
        port=h.channel.port,
        start_tls=True,
        tls_context=context,
    )
    assert [m.content for m in h.inbox.messages] == ["Over TLS"]


async def test_the_bound_port_is_reported_and_stop_closes_it(make_channel: Any) -> None:
    h = await make_channel()
    port = h.channel.port
    assert port > 0
    await h.channel.stop()
    with pytest.raises(RuntimeError):
        _ = h.channel.port
    with pytest.raises(aiosmtplib.SMTPConnectError):
        await deliver(port, mail("Hi"))


def test_settings_are_a_frozen_value() -> None:
    value = settings()
    assert replace(value, listen_port=2525).listen_port == 2525
    with pytest.raises(AttributeError):
        value.listen_port = 1  # type: ignore[misc]
