"""Email end to end: a forwarded mail over SMTP into a whole gateway, a threaded reply at an
SMTP sink, and the answer to that reply continuing the same session with the quote stripped."""

from __future__ import annotations

from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from storage.models import Session, SessionMessage
from tests.channels.email_mail import (
    APPLE_FORWARD,
    GMAIL_FORWARD,
    OUTLOOK_FORWARD,
    deliver,
    mail,
)
from tests.e2e.harness import free_port, gateway_config, running_gateway
from tests.fakes.smtp_sink import SmtpSink

ASSISTANT = "assistant@acme.example"


def email_config(database_url: str, tmp_path: Path, sink: SmtpSink) -> tuple[Any, int]:
    port = free_port()
    config = gateway_config(
        database_url,
        tmp_path,
        identity={"users": [{"id": "alice", "org": "acme", "email": ["alice@example.com"]}]},
        channels={
            "email": {
                "enabled": True,
                "listen_port": port,
                "addresses": [ASSISTANT],
                # DNS is out of reach in tests; the channel's own tests cover `verify`.
                "auth": {"mode": "off"},
                "outbound": {"host": "127.0.0.1", "port": sink.port},
            }
        },
    )
    return config, port


def answer_to(reply: EmailMessage, text: str) -> bytes:
    """What a mail client sends when Alice answers the assistant's reply, quoting it."""
    quoted = "\n".join(
        f"> {line}" for line in reply.get_body(("plain",)).get_content().splitlines()
    )
    answer = EmailMessage()
    answer["From"] = "Alice Example <alice@example.com>"
    answer["To"] = ASSISTANT
    answer["Subject"] = f"Re: {reply['Subject'].removeprefix('Re: ')}"
    answer["Message-ID"] = "<answer-1@example.com>"
    answer["In-Reply-To"] = reply["Message-ID"]
    answer["References"] = f"{reply['References']} {reply['Message-ID']}"
    answer.set_content(f"{text}\n\nOn Mon, the assistant wrote:\n{quoted}\n")
    return answer.as_bytes()


@pytest.mark.parametrize(
    ("body", "subject"),
    [
        (GMAIL_FORWARD, "Fwd: Budget 2025"),
        (OUTLOOK_FORWARD, "FW: Budget 2025"),
        (APPLE_FORWARD, "Fwd: Budget 2025"),
    ],
    ids=["gmail", "outlook", "apple"],
)
async def test_a_forward_gets_one_threaded_reply_and_the_answer_continues_the_session(
    tmp_path: Path, sink: SmtpSink, body: str, subject: str
) -> None:
    config, port = email_config(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", tmp_path, sink)
    forward = mail(body, subject=subject, message_id="<fwd-1@example.com>")
    async with running_gateway(config) as gateway:
        await deliver(port, forward, to=ASSISTANT)
        await deliver(port, forward, to=ASSISTANT)  # the sending MTA retried: no second reply
        (first,) = await sink.wait_for(1, timeout=15)
        reply = first.message
        await deliver(port, answer_to(reply, "Thanks! And per quarter?"), to=ASSISTANT)
        deliveries = await sink.wait_for(2, timeout=15)
        async with gateway.runtime.database.session() as db:
            sessions = list((await db.execute(select(Session))).scalars())
            messages = list(
                (await db.execute(select(SessionMessage).order_by(SessionMessage.seq))).scalars()
            )
    assert len(deliveries) == 2
    assert first.rcpt_tos == ["alice@example.com"]
    assert reply["In-Reply-To"] == "<fwd-1@example.com>"
    assert reply["Subject"] == f"Re: {subject}"
    assert "The budget is 10k" in reply.get_body(("plain",)).get_content()
    second = deliveries[1].message
    assert second["In-Reply-To"] == "<answer-1@example.com>"
    assert reply["Message-ID"] in second["References"]
    assert len(sessions) == 1
    user_messages = [m.content for m in messages if m.role == "user"]
    assert "Forwarded message from Bob Builder" in user_messages[0]
    assert user_messages[1] == "Thanks! And per quarter?"
