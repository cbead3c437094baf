"""Messages from each place a command can be asked: Slack DMs, channels and threads, Teams
personal and group chats, email and the web, built by each channel's own parser."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from channels.base import ChannelMessage, ChannelType, Conversation
from channels.slack.parse import parse_slack_event, parse_slack_shortcut
from channels.teams.parse import parse_teams_activity
from tests.channels.test_teams_parse import APP_ID as TEAMS_APP_ID
from tests.channels.test_teams_parse import CHANNEL as TEAMS_CHANNEL
from tests.channels.test_teams_parse import TENANT as TEAMS_TENANT
from tests.channels.test_teams_parse import activity as teams_activity
from tests.channels.test_teams_parse import mention as teams_mention
from tests.fakes.slack_api import BOT_USER, TEAM, direct_message, event_envelope

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def slack_message(event: dict[str, Any]) -> ChannelMessage:
    message = parse_slack_event(event_envelope(event, "EvCmd"))
    assert message is not None
    return message


def slack_dm(text: str) -> ChannelMessage:
    return slack_message(direct_message(text, ts="1700000000.000100"))


def slack_mention(text: str, channel: str = "C0001") -> ChannelMessage:
    ts = "1700000001.000100"
    return slack_message(
        {"type": "app_mention", "channel": channel, "user": "U0001", "ts": ts, "event_ts": ts}
        | {"text": f"<@{BOT_USER}> {text}"}
    )


def slack_thread_reply(text: str, channel: str = "C0001", kind: str = "channel") -> ChannelMessage:
    return slack_message(
        {
            "type": "message",
            "channel": channel,
            "channel_type": kind,
            "user": "U0001",
            "text": text,
            "ts": "1700000002.000100",
            "thread_ts": "1700000001.000100",
        }
    )


def slack_shortcut() -> ChannelMessage:
    return parse_slack_shortcut(
        {
            "type": "message_action",
            "callback_id": "send_to_assistant",
            "trigger_id": "1.2.3",
            "action_ts": "1700000003.000100",
            "team": {"id": TEAM, "domain": "acme"},
            "user": {"id": "U0001", "team_id": TEAM},
            "channel": {"id": "C0002", "name": "deals"},
            "message": {"type": "message", "user": "U0009", "text": "hi", "ts": "1700000002.1"},
        }
    )


def teams_message(text: str, conversation: dict[str, Any]) -> ChannelMessage:
    mentioned = conversation["conversationType"] != "personal"
    activity = teams_activity(
        conversation={**conversation, "tenantId": TEAMS_TENANT},
        text=f"<at>Assistant</at> {text}" if mentioned else text,
        entities=[teams_mention()] if mentioned else [],
    )
    message = parse_teams_activity(activity, bot_id=TEAMS_APP_ID)
    assert message is not None
    return message


def teams_personal(text: str) -> ChannelMessage:
    return teams_message(text, {"id": "a:1chat", "conversationType": "personal"})


def teams_channel(text: str) -> ChannelMessage:
    conversation_id = f"{TEAMS_CHANNEL};messageid=1717243100000"
    return teams_message(
        text, {"id": conversation_id, "conversationType": "channel", "isGroup": True}
    )


def teams_group_chat(text: str) -> ChannelMessage:
    return teams_message(
        text, {"id": "19:group@thread.v2", "conversationType": "groupChat", "isGroup": True}
    )


def email_message(text: str) -> ChannelMessage:
    return ChannelMessage(
        channel_type=ChannelType.EMAIL,
        channel_id="assistant@acme.example",
        message_id="<m1@acme.example>",
        user_identifier="alice@acme.example",
        content="",
        timestamp=NOW,
        thread_id="<m1@acme.example>",
        reply_context={"subject": text, "reply_to": "alice@acme.example"},
        conversation=Conversation.DIRECT,
        subject=text,
    )


def web_message(text: str) -> ChannelMessage:
    return ChannelMessage(
        channel_type=ChannelType.WEB,
        channel_id="alice",
        message_id="alice:m1",
        user_identifier="alice",
        content=text,
        timestamp=NOW,
        reply_context={"client_message_id": "m1"},
        conversation=Conversation.DIRECT,
    )


PRIVATE_PLACES = {
    "a Slack DM": slack_dm,
    "a Teams personal chat": teams_personal,
    "email": email_message,
    "the web": web_message,
}
SHARED_PLACES = {
    "a Slack channel mention": slack_mention,
    "a Slack channel thread": slack_thread_reply,
    "a Slack private channel": lambda text: slack_thread_reply(text, "G0001", "group"),
    "a Slack group DM": lambda text: slack_thread_reply(text, "C0003", "mpim"),
    "a Teams channel": teams_channel,
    "a Teams group chat": teams_group_chat,
}
