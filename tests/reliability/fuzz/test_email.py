"""Fuzzing inbound mail: every SMTP delivery ends with a reply in time, and `parse_email` turns
any bytes into a message or a `ChannelPayloadError` in bounded time."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import html
import quopri
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import aiosmtplib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.base import ChannelMessage
from channels.email.parse import parse_email
from errors import ChannelPayloadError
from tests.channels.email_mail import GMAIL_FORWARD, OUTLOOK_FORWARD
from tests.e2e.harness import free_port, gateway_config
from tests.reliability.fuzz.harness import (
    ANSWER_SECONDS,
    FUZZ,
    LoopThread,
    Target,
    gateway_on,
    sqlite_url,
)
from tests.reliability.fuzz.strategies import (
    nasty_text,
    web_ids,
)

# A failing example is printed in full, however large (a warning would hide the failure).
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

ASSISTANT = "assistant@acme.example"
MAIL_SENDERS = [
    "Alice Example <alice@example.com>",
    "alice@example.com",
    "=?utf-8?q?Al=C3=AFce?= <alice@example.com>",
    '"Example, Alice" <alice@example.com>',
    "Bob <bob@example.org>",
    "<>",
    "not an address",
    "alice@example.com, bob@example.org",
    "a" * 300 + "@example.com",
    "=?x-unknown?b?????=",
    "Alice <alice@@example..com>",
    "(((((((((((((((((((((comment",
    "Alice \udcff <alice@example.com>",
]
CHARSETS = [
    "utf-8",
    "us-ascii",
    "iso-8859-1",
    "windows-1252",
    "koi8-r",
    "utf-16",
    "utf-7",
    "shift_jis",
    "x-unknown-charset",
    "",
    'utf-8"; name="x',
]
TRANSFER_ENCODINGS = ["7bit", "8bit", "binary", "quoted-printable", "base64", "x-uuencode", "bogus"]
mail_texts = st.one_of(
    nasty_text,
    st.text(max_size=300),
    st.sampled_from(
        [
            GMAIL_FORWARD,
            OUTLOOK_FORWARD,
            "Thanks!\n\nOn Mon, 3 Feb 2025, Bob wrote:\n> the budget\n> is 10k\n",
            "-----Original Message-----\nFrom: Bob\nSent: today\nSubject: x\n\nold text",
            " " * 5_000,
            "\n" * 2_000,
            "a" * 5_000,
            ">" * 3_000,
            "word " * 3_000,
        ]
    ),
)
header_values = st.one_of(
    nasty_text,
    st.sampled_from(
        [
            "=?utf-8?b?w6k=?=",
            "=?utf-8?q?broken",
            "=?koi8-r?b?8NLJ18XU?=",
            "<id@example.com>",
            "<" * 200,
            "<a@b> <c@d> " * 200,
            "x\r\nBcc: evil@example.org",
            "Mon, 99 Foo 99999 99:99:99 +9999",
            "Sat, 01 Mar 2025 10:00:00 +0000",
            "auto-replied",
            "bulk",
        ]
    ),
)


def _leaf(content_type: str, charset: str, encoding: str, payload: bytes) -> bytes:
    if encoding == "base64":
        body = base64.encodebytes(payload)
    elif encoding == "quoted-printable":
        body = quopri.encodestring(payload)
    else:
        body = payload
    head = f'Content-Type: {content_type}; charset="{charset}"\r\n'
    head += f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    return head.encode("utf-8", "surrogateescape") + body


def _encode(text: str, charset: str, lie: bool) -> bytes:
    """`text` in `charset`, or (when the mail lies about its charset) in UTF-8."""
    if not lie:
        with contextlib.suppress(LookupError, UnicodeError):
            return text.encode(charset or "ascii")
    return text.encode("utf-8", "surrogatepass")


@st.composite
def mime_entities(draw: st.DrawFn, depth: int = 0) -> bytes:
    """A MIME entity (its content headers and body): plain, HTML, alternative, attachments,
    an attached message (nested up to two levels), or empty."""
    kinds = ["plain", "html", "empty", "alternative", "mixed", "attached"]
    kind = draw(st.sampled_from(kinds if depth < 2 else kinds[:3]))
    charset = draw(st.sampled_from(CHARSETS))
    encoding = draw(st.sampled_from(TRANSFER_ENCODINGS))
    text = draw(mail_texts)
    lie = draw(st.booleans())
    if kind == "plain":
        return _leaf("text/plain", charset, encoding, _encode(text, charset, lie))
    if kind == "html":
        markup = f"<html><body><p>{html.escape(text)}</p><blockquote>old</blockquote></body>"
        return _leaf("text/html", charset, encoding, _encode(markup, charset, lie))
    if kind == "empty":
        return b"Content-Type: text/plain\r\n\r\n"
    if kind == "alternative":
        parts = [draw(mime_entities(depth=2)), draw(mime_entities(depth=2))]
        return _multipart("alternative", draw(boundaries), parts)
    if kind == "mixed":
        name = draw(st.one_of(nasty_text, st.just("report.pdf")))
        attachment = (
            f'Content-Type: application/octet-stream; name="{name}"\r\n'
            f'Content-Disposition: attachment; filename="{name}"\r\n'
            "Content-Transfer-Encoding: base64\r\n\r\n"
        ).encode("utf-8", "surrogatepass") + base64.encodebytes(draw(st.binary(max_size=100)))
        parts = [draw(mime_entities(depth=depth + 1)), attachment]
        return _multipart("mixed", draw(boundaries), parts)
    inner = draw(raw_mails(depth=depth + 1))
    wrapped_encoding = draw(st.sampled_from(["", "base64", "quoted-printable", "7bit"]))
    if wrapped_encoding == "base64":
        inner = base64.encodebytes(inner)
    elif wrapped_encoding == "quoted-printable":
        inner = quopri.encodestring(inner)
    attached = b"Content-Type: message/rfc822\r\n"
    if wrapped_encoding:
        attached += f"Content-Transfer-Encoding: {wrapped_encoding}\r\n".encode()
    attached += b"\r\n" + inner
    return _multipart(
        "mixed", draw(boundaries), [_leaf("text/plain", "utf-8", "7bit", b"fyi"), attached]
    )


boundaries = st.sampled_from(["b1", "=_part_0_=", "a" * 70, "x y", "", '"', "b1--"])


def _multipart(subtype: str, boundary: str, parts: list[bytes]) -> bytes:
    mark = boundary.encode()
    body = b"This is a multi-part message.\r\n"
    for part in parts:
        body += b"--" + mark + b"\r\n" + part + b"\r\n"
    body += b"--" + mark + b"--\r\n"
    head = f'Content-Type: multipart/{subtype}; boundary="{boundary}"\r\n\r\n'
    return head.encode() + body


@st.composite
def raw_mails(draw: st.DrawFn, depth: int = 0) -> bytes:
    """A whole mail: header block (From, To, Subject, ids, Date … some odd, some missing) and a
    MIME entity."""
    headers: list[tuple[str, str]] = []
    if draw(st.integers(min_value=0, max_value=9)):  # one in ten has no From
        headers.append(("From", draw(st.sampled_from([*MAIL_SENDERS[:4] * 3, *MAIL_SENDERS]))))
    headers.append(("To", ASSISTANT))
    optional = {
        "Subject": st.one_of(header_values, st.just("Fwd: Budget 2025")),
        "Message-ID": st.one_of(web_ids.map(lambda i: f"<{i}@fuzz.example>"), header_values),
        "In-Reply-To": header_values,
        "References": header_values,
        "Date": header_values,
        "MIME-Version": st.sampled_from(["1.0", "2.0", ""]),
    }
    for name, values in optional.items():
        if draw(st.booleans()):
            headers.append((name, draw(values)))
    if not draw(st.integers(min_value=0, max_value=5)):  # a bounce or an auto-reply: not answered
        headers.append(("Auto-Submitted", draw(st.sampled_from(["auto-replied", "no", "x"]))))
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return head.encode("utf-8", "surrogateescape") + draw(mime_entities(depth=depth))


@st.composite
def broken_mails(draw: st.DrawFn) -> bytes:
    """A mail after one to three blows: cut short, 8-bit junk, a huge or a thousand headers,
    bare LF line ends, the From line gone, a slice deleted (broken boundaries)."""
    data = draw(raw_mails())
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        at = draw(st.integers(min_value=0, max_value=len(data)))
        blow = draw(
            st.sampled_from(
                ["truncate", "junk", "huge header", "many headers", "bare lf", "no from", "cut"]
            )
        )
        if blow == "truncate":
            data = data[:at]
        elif blow == "junk":
            data = data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
        elif blow == "huge header":
            size = draw(st.sampled_from([998, 10_000, 20_000]))
            data = b"X-Huge: " + b"a" * size + b"\r\n" + data
        elif blow == "many headers":
            data = b"Received: from relay.example by mx.example\r\n" * 500 + data
        elif blow == "bare lf":
            data = data.replace(b"\r\n", b"\n")
        elif blow == "no from":
            data = re.sub(rb"(?im)^from:.*\r?\n", b"", data)
        else:
            data = data[:at] + data[at + draw(st.integers(min_value=1, max_value=40)) :]
    return data


any_mails = st.one_of(raw_mails(), broken_mails(), st.binary(max_size=300))


@dataclass(frozen=True)
class SmtpReply:
    code: int
    message: str


async def smtp_reply(port: int, data: bytes, mail_from: str) -> SmtpReply:
    """The reply that ends one delivery attempt of `data` (a refused MAIL or RCPT included)."""
    client = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, local_hostname="fuzz.example")
    try:
        async with asyncio.timeout(ANSWER_SECONDS):
            await client.connect()
            await client.mail(mail_from)
            await client.rcpt(ASSISTANT)
            response = await client.data(data)
    except aiosmtplib.SMTPResponseException as exc:
        return SmtpReply(exc.code, exc.message)
    except TimeoutError:
        raise AssertionError(f"no SMTP reply within {ANSWER_SECONDS} s: a hang") from None
    finally:
        if client.is_connected:
            with contextlib.suppress(aiosmtplib.SMTPException):
                await client.quit()
    return SmtpReply(response.code, response.message)


@pytest.fixture(scope="class")
def email(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("email")
    config = gateway_config(
        sqlite_url(folder),
        folder,
        identity={"users": [{"id": "alice", "org": "acme", "email": ["alice@example.com"]}]},
        channels={
            "email": {
                "enabled": True,
                "listen_port": free_port(),
                "addresses": [ASSISTANT],
                "auth": {"mode": "off"},  # DNS is out of reach in tests
                "outbound": {"host": "127.0.0.1", "port": free_port()},  # closed: fine
                "replies_per_sender_per_hour": 0,
            }
        },
    )
    with gateway_on(loop, config) as target:
        yield target


class TestEmailChannel:
    """The inbound SMTP server."""

    def test_every_mail_delivery_ends_with_an_smtp_reply_in_time(self, email: Target) -> None:
        port = email.gateway.runtime.config.channels.email.listen_port
        seen: Counter[str] = Counter()

        @settings(FUZZ, max_examples=250)
        @given(
            data=any_mails,
            mail_from=st.sampled_from(["alice@example.com", "alice@example.com", "bob@x.org", ""]),
        )
        def example(data: bytes, mail_from: str) -> None:
            reply = email.loop.run(smtp_reply(port, data, mail_from))
            seen["queued" if "queued" in reply.message else str(reply.code)] += 1
            assert reply.code == 250 or reply.code == 451 or 500 <= reply.code < 600, reply
            # The channel turns any exception into a 451: that is a crash all the same.
            assert "Internal error" not in reply.message, reply

        example()
        assert {"queued", "250", "550"} <= set(seen), seen
        email.assert_healthy()
        email.assert_no_failed_turns()


def test_parse_email_returns_a_message_or_a_payload_error_in_bounded_time() -> None:
    seen: Counter[str] = Counter()

    @settings(FUZZ, max_examples=600)
    @given(data=any_mails)
    def example(data: bytes) -> None:
        started = time.monotonic()
        try:
            outcome: ChannelMessage | str = parse_email(data)
        except ChannelPayloadError as exc:
            outcome = str(exc)  # the reason the SMTP reply will carry
        assert time.monotonic() - started < 3.0
        if isinstance(outcome, str):
            assert outcome.strip()
            seen["refused"] += 1
        else:
            assert isinstance(outcome, ChannelMessage)
            seen["forward" if outcome.forwarded else "message"] += 1

    example()
    assert {"refused", "message", "forward"} <= set(seen), seen
