"""Raw mail to `ChannelMessage`: sender and ids, bodies, charsets, attachments, forwards and
replies with the quote stripped."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from email.message import EmailMessage

import pytest

from channels.base import ChannelType
from channels.email.parse import parse_email, references_of

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def plain(body: str, **headers: str) -> bytes:
    message = EmailMessage()
    message["From"] = headers.pop("From", "Alice Example <alice@example.com>")
    message["To"] = headers.pop("To", "assistant@acme.example")
    message["Subject"] = headers.pop("Subject", "Question")
    message["Message-ID"] = headers.pop("Message_ID", "<m1@example.com>")
    message["Date"] = "Sat, 01 Mar 2025 10:00:00 +0000"
    for name, value in headers.items():
        message[name.replace("_", "-")] = value
    message.set_content(body)
    return message.as_bytes()


def test_a_plain_mail_becomes_a_channel_message() -> None:
    message = parse_email(plain("Hello, can you summarise this?"), received_at=NOW)
    assert message.channel_type is ChannelType.EMAIL
    assert message.user_identifier == "alice@example.com"
    assert message.channel_id == "assistant@acme.example"
    assert message.message_id == "m1@example.com"
    assert message.thread_id == "m1@example.com"
    assert message.content == "Hello, can you summarise this?"
    assert message.timestamp == NOW
    assert message.reply_context["subject"] == "Question"
    assert message.reply_context["reply_to"] == "alice@example.com"
    assert message.forwarded is None
    assert "Hello" not in str(message.raw)  # the body is not kept in raw
    assert message.raw["size"] > 0


def test_without_a_receipt_time_the_date_header_is_the_timestamp() -> None:
    message = parse_email(plain("Hi"))
    assert message.timestamp == datetime(2025, 3, 1, 10, 0, tzinfo=UTC)


def test_the_envelope_recipient_is_the_channel() -> None:
    message = parse_email(plain("Hi", To="Team <team@acme.example>"), recipient="Bot@Acme.example")
    assert message.channel_id == "bot@acme.example"


def test_ids_have_one_normal_form_without_angle_brackets() -> None:
    data = plain(
        "Thanks",
        Message_ID="  <reply-2@example.com> ",
        In_Reply_To="<ours.1@acme.example>",
        References="<root@example.com> <ours.1@acme.example>",
    ).replace(b"<root@example.com> <ours", b"<root@example.com>\n <ours")  # folded
    message = parse_email(data)
    assert message.message_id == "reply-2@example.com"
    assert message.references == ("ours.1@acme.example", "root@example.com")
    assert message.thread_id == "root@example.com"  # the thread is the root Message-ID
    assert message.reply_context["references"] == ["root@example.com", "ours.1@acme.example"]
    assert references_of(data) == ("ours.1@acme.example", "root@example.com")


def test_a_reply_without_references_threads_on_in_reply_to() -> None:
    message = parse_email(plain("Thanks", In_Reply_To="<ours.1@acme.example>"))
    assert message.thread_id == "ours.1@acme.example"
    assert message.references == ("ours.1@acme.example",)


def test_a_missing_message_id_gets_a_stable_hash_id() -> None:
    data = plain("Hi").replace(b"Message-ID: <m1@example.com>\n", b"")
    first = parse_email(data)
    relayed = parse_email(b"Received: from relay.example by mx.acme.example\n" + data)
    assert first.message_id.startswith("sha256.")
    assert first.message_id == relayed.message_id  # trace headers added on the way don't count
    assert parse_email(data.replace(b"Hi", b"Ho")).message_id != first.message_id


def test_multipart_alternative_prefers_the_plain_text() -> None:
    message = EmailMessage()
    message["From"] = "alice@example.com"
    message["To"] = "assistant@acme.example"
    message["Subject"] = "Both"
    message.set_content("Plain version")
    message.add_alternative("<p>HTML <b>version</b></p>", subtype="html")
    assert parse_email(message.as_bytes()).content == "Plain version"


def test_html_only_mail_is_converted_to_text() -> None:
    message = EmailMessage()
    message["From"] = "alice@example.com"
    message["To"] = "assistant@acme.example"
    message.set_content(
        "<html><body><p>First <b>para</b></p><ul><li>one</li><li>two</li></ul></body></html>",
        subtype="html",
    )
    content = parse_email(message.as_bytes()).content
    assert "First para" in content
    assert "one" in content
    assert "two" in content
    assert "<" not in content


def test_an_html_reply_loses_its_quoted_part() -> None:
    html = (
        "<div>Sounds good, thanks!</div><div class='gmail_quote'>"
        "<div>On Mon, Bob wrote:</div><blockquote>The old message</blockquote></div>"
    )
    message = EmailMessage()
    message["From"] = "alice@example.com"
    message["To"] = "assistant@acme.example"
    message["Subject"] = "Re: plan"
    message.set_content(html, subtype="html")
    assert parse_email(message.as_bytes()).content == "Sounds good, thanks!"


@pytest.mark.parametrize(
    ("declared", "body", "expected"),
    [
        ("iso-8859-1", "Grüße aus Köln".encode("latin-1"), "Grüße aus Köln"),
        ("koi8-r", "Привет".encode("koi8-r"), "Привет"),
        # Mislabelled: UTF-8 bytes declared as Latin-1 (common) and as ASCII.
        ("iso-8859-1", "Grüße".encode(), "Grüße"),
        ("us-ascii", "naïve café".encode(), "naïve café"),
        # Unknown charset names fall back instead of failing.
        ("x-unknown-charset", b"plain ascii", "plain ascii"),
    ],
)
def test_charsets_are_decoded_even_when_wrong(declared: str, body: bytes, expected: str) -> None:
    data = (
        b"From: alice@example.com\r\nTo: assistant@acme.example\r\nSubject: x\r\n"
        b"Content-Type: text/plain; charset=" + declared.encode() + b"\r\n"
        b"Content-Transfer-Encoding: 8bit\r\n\r\n" + body + b"\r\n"
    )
    assert parse_email(data).content == expected


def test_8bit_body_without_any_declared_charset() -> None:
    latin = b"From: alice@example.com\r\nTo: assistant@acme.example\r\n\r\nCaf\xe9 cr\xe8me\r\n"
    utf8 = b"From: alice@example.com\r\nTo: assistant@acme.example\r\n\r\nCaf\xc3\xa9\r\n"
    assert parse_email(latin).content == "Café crème"
    assert parse_email(utf8).content == "Café"


def test_8bit_headers_and_encoded_words_are_decoded() -> None:
    data = (
        "From: =?utf-8?q?J=C3=BCrgen?= <juergen@example.com>\r\n"
        "To: assistant@acme.example\r\nSubject: Über Straße\r\n\r\nHallo\r\n"
    ).encode()
    message = parse_email(data)
    assert message.reply_context["subject"] == "Über Straße"
    assert message.reply_context["reply_to_name"] == "Jürgen"


def test_attachments_are_kept_as_metadata() -> None:
    message = EmailMessage()
    message["From"] = "alice@example.com"
    message["To"] = "assistant@acme.example"
    message.set_content("See attached.")
    message.add_attachment(
        b"%PDF-1.4 " + b"x" * 1000, maintype="application", subtype="pdf", filename="report.pdf"
    )
    message.add_attachment(b"\x89PNG....", maintype="image", subtype="png", filename="chart.png")
    parsed = parse_email(message.as_bytes())
    assert parsed.content == "See attached."
    assert [(a.filename, a.content_type, a.size) for a in parsed.attachments] == [
        ("report.pdf", "application/pdf", 1009),
        ("chart.png", "image/png", 8),
    ]


def _with_attached_message(inner: bytes, *, encoding: str | None) -> bytes:
    payload = base64.encodebytes(inner) if encoding == "base64" else inner
    cte = f"Content-Transfer-Encoding: {encoding}\r\n" if encoding else ""
    return (
        b"From: alice@example.com\r\nTo: assistant@acme.example\r\nSubject: Fwd: Budget\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=XYZ\r\n\r\n"
        b"--XYZ\r\nContent-Type: text/plain\r\n\r\nCan you check the numbers below?\r\n"
        b"--XYZ\r\nContent-Type: message/rfc822\r\n"
        + cte.encode()
        + b"\r\n"
        + payload
        + b"\r\n--XYZ--\r\n"
    )


INNER = (
    b"From: Bob Builder <bob@example.org>\r\nTo: alice@example.com\r\n"
    b"Subject: Budget 2025\r\nDate: Mon, 3 Feb 2025 09:00:00 +0100\r\n\r\n"
    b"The budget is 10k.\r\n"
)


@pytest.mark.parametrize("encoding", [None, "base64"])
def test_an_attached_message_is_the_forward(encoding: str | None) -> None:
    message = parse_email(_with_attached_message(INNER, encoding=encoding))
    assert message.content == "Can you check the numbers below?"
    assert message.forwarded is not None
    assert message.forwarded.sender == "bob@example.org"
    assert message.forwarded.sender_name == "Bob Builder"
    assert message.forwarded.subject == "Budget 2025"
    assert message.forwarded.date == "Mon, 3 Feb 2025 09:00:00 +0100"
    assert message.forwarded.body == "The budget is 10k."
    assert [a.content_type for a in message.attachments] == ["message/rfc822"]


GMAIL_FORWARD = """Please summarise this for me.

---------- Forwarded message ---------
From: Bob Builder <bob@example.org>
Date: Mon, Feb 3, 2025 at 9:00 AM
Subject: Budget 2025
To: Alice <alice@example.com>


The budget is 10k.
Second line.
"""

OUTLOOK_FORWARD = """Please summarise this for me.

________________________________
From: Bob Builder <bob@example.org>
Sent: Monday, February 3, 2025 9:00 AM
To: Alice <alice@example.com>
Subject: Budget 2025

The budget is 10k.
Second line.
"""

APPLE_FORWARD = """Please summarise this for me.

Begin forwarded message:

> From: Bob Builder <bob@example.org>
> Subject: Budget 2025
> Date: 3 February 2025 at 09:00:00 CET
> To: Alice <alice@example.com>
>
> The budget is 10k.
> Second line.
"""


@pytest.mark.parametrize(
    ("body", "subject"),
    [
        (GMAIL_FORWARD, "Fwd: Budget 2025"),
        (OUTLOOK_FORWARD, "FW: Budget 2025"),
        (APPLE_FORWARD, "Fwd: Budget 2025"),
        (GMAIL_FORWARD, "see below"),  # an edited subject: Gmail's separator still counts
    ],
    ids=["gmail", "outlook", "apple-mail", "gmail-edited-subject"],
)
def test_inline_forwards_are_found(body: str, subject: str) -> None:
    message = parse_email(plain(body, Subject=subject))
    assert message.content == "Please summarise this for me."
    assert message.forwarded is not None
    assert (message.forwarded.sender, message.forwarded.sender_name) == (
        "bob@example.org",
        "Bob Builder",
    )
    assert message.forwarded.subject == "Budget 2025"
    assert message.forwarded.date
    assert message.forwarded.body == "The budget is 10k.\nSecond line."


def test_an_outlook_reply_is_not_mistaken_for_a_forward() -> None:
    body = OUTLOOK_FORWARD.replace("Please summarise this for me.", "Agreed.")
    message = parse_email(plain(body, Subject="RE: Budget 2025"))
    assert message.forwarded is None
    assert message.content == "Agreed."


def test_a_reply_loses_our_quoted_text_and_the_quote() -> None:
    ours = "The budget for 2025 is ten thousand euros, split across four quarters."
    body = (
        "Great, and what about 2026?\n\n"
        "On Sat, 1 Mar 2025 at 11:00, Assistant <assistant@acme.example> wrote:\n"
        "> The budget for 2025 is ten thousand euros, split across\n"
        "> four quarters.\n"
    )
    message = parse_email(plain(body, In_Reply_To="<ours@acme.example>"), own_texts=[ours])
    assert message.content == "Great, and what about 2026?"


def test_our_text_is_removed_even_when_quoted_without_any_marker() -> None:
    ours = "Here are three options for the offsite: Lisbon, Porto and Madeira."
    body = (
        "Let's go with Porto.\n\n"
        "Here are three options for the offsite:\nLisbon, Porto and Madeira.\n"
    )
    message = parse_email(plain(body), own_texts=[ours])
    assert message.content == "Let's go with Porto."


def test_interleaved_answers_survive_quote_stripping() -> None:
    body = (
        "On Mon, Bob wrote:\n> First question?\n\nFirst answer.\n\n"
        "> Second question?\n\nSecond answer.\n"
    )
    assert parse_email(plain(body)).content == "First answer.\n\nSecond answer."
