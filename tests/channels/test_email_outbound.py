"""Composing replies (threading headers, subject, HTML) and the noise and rate guards."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email import policy
from email.parser import BytesParser

import pytest

from channels.base import ChannelType, OutboundMessage
from channels.email.guard import SenderRateLimit, unanswerable_reason
from channels.email.outbound import compose_reply, outbound_message_id, reply_html, reply_subject

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def outbound(**context: object) -> OutboundMessage:
    return OutboundMessage(
        message_id="01HZX-42",
        channel_type=ChannelType.EMAIL,
        channel_id="assistant@acme.example",
        content="Line one & <two>\n\nSecond paragraph.",
        in_reply_to="m2@example.com",
        reply_context={"reply_to": "alice@example.com", "subject": "Budget", **context},
    )


def test_the_reply_threads_under_the_message_it_answers() -> None:
    mail, our_id = compose_reply(
        outbound(message_id="m2@example.com", references=["root@example.com", "m1@example.com"]),
        our_address="assistant@acme.example",
        now=NOW,
    )
    assert our_id == "reply.01HZX-42@acme.example"
    assert mail["Message-ID"] == "<reply.01HZX-42@acme.example>"
    assert mail["In-Reply-To"] == "<m2@example.com>"
    assert mail["References"] == "<root@example.com> <m1@example.com> <m2@example.com>"
    assert mail["Subject"] == "Re: Budget"
    parsed = BytesParser(policy=policy.default).parsebytes(mail.as_bytes())
    assert parsed.get_body(preferencelist=("plain",)).get_content().startswith("Line one & <two>")
    html = parsed.get_body(preferencelist=("html",)).get_content()
    assert "<p>Line one &amp; &lt;two&gt;</p>" in html


def test_message_ids_are_deterministic_and_always_valid() -> None:
    assert outbound_message_id("abc-1", "acme.example") == "reply.abc-1@acme.example"
    odd = outbound_message_id("user:with spaces/and@signs", "acme.example")
    assert odd == outbound_message_id("user:with spaces/and@signs", "acme.example")
    assert odd.count("@") == 1
    assert " " not in odd


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        ("Budget", "Re: Budget"),
        ("RE: Budget", "RE: Budget"),
        ("Fwd: X", "Re: Fwd: X"),
        ("", "Re: your message"),
    ],
)
def test_reply_subjects_do_not_stack(subject: str, expected: str) -> None:
    assert reply_subject(subject) == expected


def test_reply_html_is_escaped_paragraphs() -> None:
    assert "<p>a<br>\nb</p>\n<p>c</p>" in reply_html("a\nb\n\nc")
    assert "<script>" not in reply_html("<script>alert(1)</script>")


def _headers(text: str) -> object:
    return BytesParser(policy=policy.default).parsebytes(text.encode(), headersonly=True)


@pytest.mark.parametrize(
    ("headers", "mail_from", "reason"),
    [
        ("From: alice@example.com\n", "", "null envelope sender"),
        ("From: MAILER-DAEMON@example.com\n", "mailer-daemon@example.com", "mailer daemon"),
        ("From: alice@example.com\nAuto-Submitted: auto-generated\n", "a@example.com", "Auto"),
        ("From: alice@example.com\nPrecedence: list\n", "a@example.com", "Precedence"),
        ("From: assistant@acme.example\n", "assistant@acme.example", "own address"),
    ],
)
def test_automatic_mail_is_recognised(headers: str, mail_from: str, reason: str) -> None:
    found = unanswerable_reason(
        _headers(headers),
        mail_from=mail_from,  # type: ignore[arg-type]
        ours=["assistant@acme.example"],
    )
    assert found is not None
    assert reason in found


def test_people_are_answerable() -> None:
    message = _headers("From: alice@example.com\nAuto-Submitted: no\nPrecedence: first-class\n")
    assert (
        unanswerable_reason(
            message,
            mail_from="alice@example.com",  # type: ignore[arg-type]
            ours=["assistant@acme.example"],
        )
        is None
    )


def test_the_rate_limit_is_a_sliding_hour_per_sender() -> None:
    now = [NOW]
    limit = SenderRateLimit(2, clock=lambda: now[0])
    for _ in range(2):
        assert limit.allows("Alice@Example.com")
        limit.record("alice@example.com")
    assert not limit.allows("alice@example.com")
    assert limit.allows("bob@example.com")
    now[0] += timedelta(minutes=61)
    assert limit.allows("alice@example.com")
