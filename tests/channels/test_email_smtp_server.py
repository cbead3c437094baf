"""The email channel's SMTP server on loopback: mail sent with smtplib/aiosmtplib reaches the
inbox or gets a clear SMTP answer; sender authentication; STARTTLS; the bound port."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiosmtplib
import dkim
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from channels.base import ChannelType
from channels.email.auth import DnsTemporaryError
from errors import StorageError
from tests.channels.email_channel_harness import NOW, settings
from tests.channels.email_mail import (
    APPLE_FORWARD,
    ASSISTANT,
    GMAIL_FORWARD,
    OUTLOOK_FORWARD,
    deliver,
    mail,
    smtp_code,
)


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
