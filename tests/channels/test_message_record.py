"""The stored form of an inbound message (`ChannelMessage.to_record`): every field but the
platform's payload, as JSON, read back as it was."""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import UTC, datetime, timedelta, timezone

from channels.base import (
    Attachment,
    ChannelMessage,
    ChannelType,
    Conversation,
    ForwardedContent,
)


def every_field_set() -> ChannelMessage:
    return ChannelMessage(
        channel_type=ChannelType.EMAIL,
        channel_id="support@acme.example",
        message_id="<m1@acme.example>",
        user_identifier="alice@acme.example",
        content="Please look at the attached invoice.",
        timestamp=datetime(2026, 3, 1, 9, 30, tzinfo=timezone(timedelta(hours=2))),
        thread_id="<t1@acme.example>",
        tenant="acme",
        attachments=(
            Attachment("invoice.pdf", "application/pdf", 1234, source={"stash": "k1"}),
            Attachment("logo.png", "image/png", 99, url="https://files.example/logo"),
        ),
        forwarded=ForwardedContent("bob@acme.example", "Bob", "Invoice", "Mon", "Body", ""),
        reply_context={"to": ["alice@acme.example"], "headers": {"In-Reply-To": "<m0>"}},
        raw={"payload": {"large": ["x"] * 100}},
        references=("<m0@acme.example>",),
        conversation=Conversation.DIRECT,
        subject="Invoice",
    )


def test_a_record_holds_every_field_but_the_payload_and_reads_back_as_it_was() -> None:
    message = every_field_set()
    record = message.to_record()
    assert list(record) == [f.name for f in fields(ChannelMessage) if f.name != "raw"]
    assert record["timestamp"] == "2026-03-01T07:30:00+00:00"
    assert record["attachments"][0] == {
        "filename": "invoice.pdf",
        "content_type": "application/pdf",
        "size": 1234,
        "url": None,
        "source": {"stash": "k1"},
    }
    stored = json.loads(json.dumps(record))
    assert ChannelMessage.from_record(stored, raw=message.raw) == message
    # The record is the message's copy: changing it changes nothing of the message.
    record["reply_context"]["to"] = []
    record["attachments"][0]["source"]["stash"] = "other"
    assert message.reply_context["to"] == ["alice@acme.example"]
    assert message.attachments[0].source == {"stash": "k1"}


def test_a_plain_message_records_its_defaults() -> None:
    message = ChannelMessage(
        ChannelType.WEB, "web", "w1", "alice", "hello", datetime(2026, 3, 1, tzinfo=UTC)
    )
    stored = json.loads(json.dumps(message.to_record()))
    assert stored["forwarded"] is None
    assert stored["attachments"] == []
    assert stored["conversation"] == "channel"
    assert ChannelMessage.from_record(stored) == message
