"""Mail as a sender writes and sends it: a message with our test headers, forwards as Gmail,
Outlook and Apple Mail write them, and delivery over SMTP on loopback with the code it ends with."""

from __future__ import annotations

import asyncio
import smtplib
from email.message import EmailMessage
from typing import Any

import aiosmtplib

ASSISTANT = "assistant@acme.example"


def mail(
    body: str,
    *,
    subject: str = "Hello",
    sender: str = "Alice Example <alice@example.com>",
    message_id: str = "<m1@example.com>",
    **headers: str,
) -> bytes:
    """A plain-text mail from Alice to the assistant; extra headers by keyword (`In_Reply_To`)."""
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
    """Send the mail over SMTP; an empty `mail_from` sends it with a null reverse-path."""
    if not mail_from:  # a null reverse-path (bounces), which aiosmtplib will not send
        await asyncio.to_thread(smtplib_send, port, data, mail_from="")
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


def smtplib_send(port: int, data: bytes, mail_from: str = "alice@example.com") -> None:
    """Send the mail with the standard library's blocking client (call it in a thread)."""
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as client:
        client.sendmail(mail_from, [ASSISTANT], data)


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
