"""Replies from the email channel through an SMTP relay (an aiosmtpd sink): threading headers,
the same Message-ID on a retry, failures as retryable or permanent; a reply to a reply continues
the thread."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from channels.base import ChannelType, OutboundMessage
from errors import DeliveryError
from tests.channels.email_mail import (
    ASSISTANT,
    GMAIL_FORWARD,
    deliver,
    mail,
    smtplib_send,
)
from tests.fakes.smtp_sink import SmtpSink


async def test_the_round_trip_forward_reply_and_reply_to_the_reply(
    make_channel: Any, sink: SmtpSink
) -> None:
    h = await make_channel()
    await asyncio.to_thread(
        smtplib_send, h.channel.port, mail(GMAIL_FORWARD, subject="Fwd: Budget 2025")
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
