"""Slack event payloads (shaped like Slack's documented examples) to `ChannelMessage`s."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from channels.base import ChannelType
from channels.slack.format import markdown_to_mrkdwn, slack_text, split_for_slack
from channels.slack.parse import parse_slack_event, parse_slack_shortcut
from errors import ChannelPayloadError

BOT = "UBOT0001"


def envelope(event: dict[str, Any], event_id: str = "Ev0001") -> dict[str, Any]:
    return {
        "token": "legacy-verification-token",
        "team_id": "T0001",
        "api_app_id": "A0001",
        "event": event,
        "type": "event_callback",
        "event_id": event_id,
        "event_time": 1_700_000_000,
        "authorizations": [
            {"enterprise_id": None, "team_id": "T0001", "user_id": BOT, "is_bot": True}
        ],
    }


def dm(**fields: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "channel": "D0001",
        "channel_type": "im",
        "user": "U0001",
        "text": "Hello there",
        "ts": "1700000000.000100",
        "event_ts": "1700000000.000100",
        **fields,
    }


def test_a_direct_message_becomes_a_channel_message() -> None:
    message = parse_slack_event(envelope(dm()))
    assert message is not None
    assert message.channel_type is ChannelType.SLACK
    assert (message.channel_id, message.thread_id) == ("D0001", "")
    assert message.message_id == "Ev0001"
    assert message.user_identifier == "T0001:U0001"
    assert message.tenant == "T0001"
    assert message.content == "Hello there"
    assert message.timestamp == datetime(2023, 11, 14, 22, 13, 20, 100, tzinfo=UTC)
    assert message.reply_context == {
        "channel": "D0001",
        "thread_ts": None,
        "team_id": "T0001",
        "ts": "1700000000.000100",
    }


def test_a_mention_in_a_channel_starts_a_thread_under_it_without_the_mention() -> None:
    event = {
        "type": "app_mention",
        "channel": "C0001",
        "user": "U0001",
        "text": f"<@{BOT}> what did we decide about <#C0002|acme>?",
        "ts": "1700000001.000200",
    }
    message = parse_slack_event(envelope(event))
    assert message is not None
    assert message.thread_id == "1700000001.000200"
    assert message.content == "what did we decide about #acme?"
    assert message.reply_context["thread_ts"] == "1700000001.000200"


def test_a_thread_reply_keeps_its_thread() -> None:
    event = dm(channel="C0001", channel_type="channel", thread_ts="1700000000.000001")
    message = parse_slack_event(envelope(event))
    assert message is not None
    assert message.thread_id == "1700000000.000001"


@pytest.mark.parametrize(
    "event",
    [
        dm(bot_id="B0001"),
        dm(subtype="bot_message"),
        dm(subtype="message_changed"),
        dm(subtype="message_deleted"),
        dm(user=BOT),
        dm(channel="C0001", channel_type="channel"),  # channel chatter, no mention
        dm(channel="C0001", channel_type="channel", text=f"<@{BOT}> hi", thread_ts="1.2"),
        {"type": "reaction_added", "user": "U0001", "reaction": "thumbsup"},
    ],
    ids=["bot", "bot-subtype", "edit", "delete", "self", "chatter", "dup-of-mention", "other"],
)
def test_what_the_gateway_must_not_answer_is_ignored(event: dict[str, Any]) -> None:
    assert parse_slack_event(envelope(event)) is None


def test_url_verification_and_other_envelopes_are_not_messages() -> None:
    assert parse_slack_event({"type": "url_verification", "challenge": "x"}) is None


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "event_callback", "event_id": "Ev1"},
        {"type": "event_callback", "event": {"type": "message"}},
        envelope({"type": "message", "user": "U1", "text": "x"}),
        envelope(dm(ts="not a number")),
    ],
)
def test_malformed_envelopes_are_refused_with_a_reason(payload: dict[str, Any]) -> None:
    with pytest.raises(ChannelPayloadError):
        parse_slack_event(payload)


def test_file_shares_keep_the_files_metadata() -> None:
    files = [
        {"name": "q3.pdf", "mimetype": "application/pdf", "size": 1234, "url_private": "https://f"}
    ]
    message = parse_slack_event(envelope(dm(files=files, subtype="file_share")))
    assert message is not None
    (attachment,) = message.attachments
    assert (attachment.filename, attachment.content_type, attachment.size) == (
        "q3.pdf",
        "application/pdf",
        1234,
    )


@pytest.mark.parametrize(
    ("mrkdwn", "text"),
    [
        ("<@U0002> look", "@Bob look"),
        ("<@U0003|carol> look", "@carol look"),
        ("<@U0009> look", "@U0009 look"),
        ("see <#C0002|acme-deals>", "see #acme-deals"),
        ("<https://example.com|the docs>", "the docs (https://example.com)"),
        ("<https://example.com>", "https://example.com"),
        ("<mailto:a@b.example|a@b.example>", "a@b.example"),
        ("<!here> and <!channel>", "@here and @channel"),
        ("<!subteam^S0001|@sales> ping", "@sales ping"),
        ("a &lt;b&gt; &amp; c", "a <b> & c"),
    ],
)
def test_mrkdwn_becomes_plain_text(mrkdwn: str, text: str) -> None:
    assert slack_text(mrkdwn, {"U0002": "Bob"}) == text


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**bold** and __also__", "*bold* and *also*"),
        ("*italic* text", "_italic_ text"),
        ("~~gone~~", "~gone~"),
        ("[the docs](https://example.com/a)", "<https://example.com/a|the docs>"),
        ("## Plan\nsteps", "*Plan*\nsteps"),
        ("a < b & c > d", "a &lt; b &amp; c &gt; d"),
        ("use `**kwargs` here", "use `**kwargs` here"),
        ("```\nx = **y**\n```", "```\nx = **y**\n```"),
        ("- item one\n- item two", "- item one\n- item two"),
    ],
)
def test_markdown_becomes_slack_mrkdwn(markdown: str, mrkdwn: str) -> None:
    assert markdown_to_mrkdwn(markdown) == mrkdwn


def test_long_answers_are_split_at_paragraphs_within_the_limit() -> None:
    paragraphs = [f"paragraph {n} " + "word " * 30 for n in range(10)]
    pieces = split_for_slack("\n\n".join(paragraphs), limit=400)
    assert all(len(piece) <= 400 for piece in pieces)
    assert " ".join(" ".join(pieces).split()) == " ".join(" ".join(paragraphs).split())
    assert all(piece.startswith("paragraph") for piece in pieces)


def test_text_without_breaks_is_still_split_within_the_limit() -> None:
    pieces = split_for_slack("x" * 1000, limit=300)
    assert [len(piece) for piece in pieces] == [300, 300, 300, 100]
    assert split_for_slack("   ") == []


def test_a_message_shared_into_a_dm_becomes_forwarded_content() -> None:
    shared = {
        "is_share": True,
        "is_msg_unfurl": True,
        "author_id": "U0009",
        "author_name": "Carol",
        "channel_id": "C0002",
        "channel_name": "deals",
        "from_url": "https://acme.slack.com/archives/C0002/p1700000350000200",
        "text": "Acme signed for <https://acme.example/deal|300 anvils>",
        "ts": "1700000350.000200",
    }
    message = parse_slack_event(envelope(dm(text="what do you think?", attachments=[shared])))
    assert message is not None
    assert message.content == "what do you think?"
    assert message.forwarded is not None
    assert message.forwarded.sender_name == "Carol"
    assert message.forwarded.subject == "Slack message in #deals"
    assert message.forwarded.body == "Acme signed for 300 anvils (https://acme.example/deal)"
    assert message.forwarded.link == shared["from_url"]
    assert message.forwarded.date.startswith("2023-11-14T22:19:10")


def shortcut_payload(**fields: Any) -> dict[str, Any]:
    return {
        "type": "message_action",
        "callback_id": "send_to_assistant",
        "trigger_id": "13345224609.738474920.8088930838d88f008e0",
        "action_ts": "1700000400.000100",
        "team": {"id": "T0001", "domain": "acme"},
        "user": {"id": "U0001", "username": "alice", "team_id": "T0001"},
        "channel": {"id": "C0002", "name": "deals"},
        "message": {"type": "message", "user": "U0009", "text": "Ship on Friday", "ts": "17.5"},
        "message_ts": "17.5",
        **fields,
    }


def test_the_send_to_assistant_shortcut_forwards_the_message_with_its_permalink() -> None:
    message = parse_slack_shortcut(shortcut_payload(), {"U0009": "Carol"})
    assert message.message_id == "shortcut:13345224609.738474920.8088930838d88f008e0"
    assert (message.user_identifier, message.channel_id) == ("T0001:U0001", "U0001")
    assert message.forwarded is not None
    assert (message.forwarded.sender, message.forwarded.sender_name) == ("U0009", "Carol")
    assert message.forwarded.body == "Ship on Friday"
    assert message.forwarded.link == "https://acme.slack.com/archives/C0002/p175"
    assert message.reply_context["channel"] == "U0001"


@pytest.mark.parametrize("missing", ["user", "trigger_id"])
def test_a_shortcut_without_its_user_or_trigger_is_refused(missing: str) -> None:
    payload = shortcut_payload()
    del payload[missing]
    with pytest.raises(ChannelPayloadError):
        parse_slack_shortcut(payload)
