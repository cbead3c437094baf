"""Bad input to `parse_email` ends in a message or a `ChannelPayloadError`, never anything else,
and in bounded time: unroutable mail, broken MIME, huge lines, fuzzed bytes."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from channels.base import ChannelMessage
from channels.email.parse import parse_email
from errors import ChannelPayloadError


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"   \r\n", "empty"),
        (b"To: assistant@acme.example\r\nSubject: no sender\r\n\r\nHi\r\n", "From"),
        (b"From: not an address\r\nTo: assistant@acme.example\r\n\r\nHi\r\n", "From"),
        (bytes(range(256)) * 20, "From"),  # binary junk
    ],
)
def test_mail_that_cannot_be_routed_raises_a_payload_error(data: bytes, reason: str) -> None:
    with pytest.raises(ChannelPayloadError, match=reason):
        parse_email(data)


@pytest.mark.parametrize(
    "data",
    [
        # truncated MIME: the closing boundary and half the part are missing
        b"From: alice@example.com\r\nContent-Type: multipart/mixed; boundary=B\r\n\r\n"
        b"--B\r\nContent-Type: text/plain\r\n\r\nHello there",
        # broken boundary: declared but never used
        b"From: alice@example.com\r\nContent-Type: multipart/alternative; boundary=NOPE\r\n\r\n"
        b"Hello there\r\n",
        # no boundary parameter at all
        b"From: alice@example.com\r\nContent-Type: multipart/mixed\r\n\r\nHello there\r\n",
        # invalid base64 body
        b"From: alice@example.com\r\nContent-Transfer-Encoding: base64\r\n\r\n!!!not base64!!!\r\n",
        # a huge header and deeply nested comments in an address header
        b"From: alice@example.com\r\nX-Junk: "
        + b"a" * 200_000
        + b"\r\nTo: "
        + b"(" * 5000
        + b"\r\n\r\nHello there\r\n",
        # empty body, HTML-only with broken markup
        b"From: alice@example.com\r\n\r\n",
        b"From: alice@example.com\r\nContent-Type: text/html\r\n\r\n<div><p>Hello <b>there",
    ],
    ids=[
        "truncated",
        "unused-boundary",
        "no-boundary",
        "bad-base64",
        "huge-header",
        "empty",
        "broken-html",
    ],
)
def test_malformed_mail_still_parses(data: bytes) -> None:
    message = parse_email(data)
    assert message.user_identifier == "alice@example.com"
    assert "<" not in message.content


def test_a_gigantic_single_line_body_is_bounded_in_time() -> None:
    line = ("On " + "word, <x@y.z> " * 40_000 + " wrote") * 3
    data = b"From: alice@example.com\r\nSubject: Fwd: x\r\n\r\n" + line.encode()
    started = time.monotonic()
    message = parse_email(data)
    assert time.monotonic() - started < 10
    assert len(message.content) <= 110_000


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=3000),
        st.builds(
            lambda head, body: head + b"\r\n\r\n" + body,
            st.sampled_from(
                [
                    b"From: a@example.com",
                    b"From: a@example.com\r\nContent-Type: multipart/mixed; boundary=b",
                    b"From: a@example.com\r\nContent-Type: message/rfc822\r\n"
                    b"Content-Transfer-Encoding: base64",
                    b"From: =?utf-8?b?w6k=?= <a@example.com>\r\nSubject: Fwd: =?x?q?y?=",
                    b"From: a@example.com\r\nContent-Type: text/html; charset=bogus",
                ]
            ),
            st.binary(max_size=3000),
        ),
        st.text(max_size=2000).map(
            lambda text: ("From: a@example.com\nSubject: Fwd: t\n\n" + text).encode(
                "utf-8", "surrogatepass"
            )
        ),
    )
)
def test_fuzz_parse_email_returns_a_message_or_a_payload_error(data: bytes) -> None:
    started = time.monotonic()
    try:
        message = parse_email(data)
    except ChannelPayloadError:
        pass
    else:
        assert isinstance(message, ChannelMessage)
        assert message.user_identifier
    assert time.monotonic() - started < 5
