"""Slack payloads to `ChannelMessage`s: pure functions, no I/O.

`parse_slack_event` reads an Events API envelope (`event_callback`) and returns the message
the gateway should answer, or None for what it must ignore: its own and other bots' messages,
edits and deletions, and channel messages that do not mention it (a mention arrives as its own
`app_mention` event, so a `message` event that mentions the bot is ignored too, or it would be
answered twice). A message the user shared into the conversation becomes `forwarded` content.
`parse_slack_shortcut` reads the "Send to assistant" message shortcut.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from channels.base import (
    Attachment,
    ChannelMessage,
    ChannelType,
    Conversation,
    ForwardedContent,
)
from channels.slack.format import slack_text
from errors import ChannelPayloadError

SHORTCUT_CALLBACK_ID = "send_to_assistant"  # config/slack-app-manifest.yaml declares it
IGNORED_SUBTYPES = frozenset(
    {"message_changed", "message_deleted", "bot_message", "channel_join", "channel_leave"}
)


# Slack conversation ids: D… is a direct message with the app; G… a group DM or private
# channel; C… a channel. Posting to a user id (U…, W…) delivers to the app's DM with them, so
# those are the places only the user and the app share.
DIRECT_PREFIXES = ("D", "U", "W")


def conversation_of(channel: str, channel_type: object = None) -> Conversation:
    """Who reads a Slack conversation: the user alone (a DM), a group, or a channel."""
    if channel_type == "im" or channel.startswith(DIRECT_PREFIXES):
        return Conversation.DIRECT
    if channel_type in ("mpim", "group") or channel.startswith("G"):
        return Conversation.GROUP
    return Conversation.CHANNEL


def _timestamp(ts: str) -> datetime:
    try:
        return datetime.fromtimestamp(float(ts), UTC)
    except (TypeError, ValueError, OverflowError, OSError) as exc:
        raise ChannelPayloadError(f"invalid Slack timestamp {ts!r}") from exc


def _bot_user_id(envelope: Mapping[str, Any]) -> str:
    for authorization in envelope.get("authorizations") or ():
        if isinstance(authorization, Mapping) and authorization.get("is_bot"):
            return str(authorization.get("user_id", ""))
    return ""


def _listed(value: object, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ChannelPayloadError(f"'{name}' must be a list")
    return value


def file_size(item: Mapping[str, Any]) -> int:
    """The size a Slack file object declares, 0 when it does not say."""
    try:
        return max(int(str(item.get("size") or 0)), 0)
    except ValueError:
        return 0


def file_source(item: Mapping[str, Any]) -> dict[str, Any]:
    """What fetching a Slack file needs (`channels.slack.files`): its id, where to download
    it (`url_private_download`, else `url_private`), whether Slack does not host it (a Google
    Drive or Dropbox link), and whether the event named it without describing it
    (`file_access: check_file_info`, as in Slack Connect: `files.info` says the rest)."""
    source: dict[str, Any] = {
        "slack_file": str(item.get("id") or ""),
        "external": bool(item.get("is_external") or item.get("external_type")),
    }
    download = item.get("url_private_download") or item.get("url_private")
    if download:
        source["download"] = str(download)
    if item.get("file_access") == "check_file_info":
        source["lookup"] = True
    return source


def _attachments(event: Mapping[str, Any]) -> tuple[Attachment, ...]:
    """The files of a message and of the messages shared into it, each file once (a shared
    message's odd `files` is skipped: the message itself is still worth answering)."""
    items = list(_listed(event.get("files"), "files"))
    for shared in _listed(event.get("attachments"), "attachments"):
        if isinstance(shared, Mapping) and (shared.get("is_share") or shared.get("is_msg_unfurl")):
            files = shared.get("files")
            items += files if isinstance(files, list) else []
    found: dict[str, Attachment] = {}
    for item in items:
        if not isinstance(item, Mapping):
            continue
        source = file_source(item)
        key = source["slack_file"] or f"#{len(found)}"  # a file without an id is kept too
        found.setdefault(
            key,
            Attachment(
                filename=str(item.get("name") or item.get("title") or "file"),
                content_type=str(item.get("mimetype") or "application/octet-stream"),
                size=file_size(item),
                url=str(item["url_private"]) if item.get("url_private") else None,
                source=source,
            ),
        )
    return tuple(found.values())


def permalink(team_domain: str, channel: str, ts: str) -> str:
    """The web link of a message, built the way Slack builds it (no API call needed)."""
    if not (team_domain and channel and ts):
        return ""
    return f"https://{team_domain}.slack.com/archives/{channel}/p{ts.replace('.', '')}"


def _shared_message(event: Mapping[str, Any], names: Mapping[str, str]) -> ForwardedContent | None:
    """A message the user shared into the conversation (Slack's "share message"), if any."""
    for item in _listed(event.get("attachments"), "attachments"):
        if isinstance(item, Mapping) and (item.get("is_share") or item.get("is_msg_unfurl")):
            author = str(item.get("author_id") or item.get("author_name") or "")
            channel = str(item.get("channel_name") or item.get("channel_id") or "")
            return ForwardedContent(
                sender=author,
                sender_name=str(item.get("author_name") or names.get(author, author)),
                subject=f"Slack message in #{channel}" if channel else "Slack message",
                date=_iso_date(item.get("ts")),
                body=slack_text(str(item.get("text") or ""), names),
                link=str(item.get("from_url") or ""),
            )
    return None


def _iso_date(ts: object) -> str:
    try:
        return datetime.fromtimestamp(float(str(ts)), UTC).isoformat()
    except (TypeError, ValueError, OverflowError, OSError):
        return ""


def parse_slack_event(
    envelope: Mapping[str, Any], names: Mapping[str, str] | None = None
) -> ChannelMessage | None:
    """The message in an `event_callback` envelope, or None when the gateway ignores it.

    Raises `ChannelPayloadError` when the envelope lacks what every event has.
    """
    if envelope.get("type") != "event_callback":
        return None
    event = envelope.get("event")
    event_id = envelope.get("event_id")
    team_id = envelope.get("team_id") or ""
    if not isinstance(event, Mapping) or not isinstance(event_id, str) or not event_id:
        raise ChannelPayloadError("an event_callback needs 'event' and 'event_id'")
    kind = event.get("type")
    if kind not in ("message", "app_mention"):
        return None
    bot_user = _bot_user_id(envelope)
    user = event.get("user")
    if (
        event.get("bot_id")
        or event.get("subtype") in IGNORED_SUBTYPES
        or not isinstance(user, str)
        or (bot_user and user == bot_user)
    ):
        return None
    channel = event.get("channel")
    ts = event.get("ts")
    if not isinstance(channel, str) or not isinstance(ts, str):
        raise ChannelPayloadError("a message event needs 'channel' and 'ts'")
    text = str(event.get("text") or "")
    thread_ts = str(event.get("thread_ts") or "")
    direct = event.get("channel_type") == "im" or channel.startswith(DIRECT_PREFIXES)
    mentions_bot = bool(bot_user) and f"<@{bot_user}" in text
    if kind == "message" and not direct and (mentions_bot or not thread_ts):
        return None  # mentions come as app_mention; other channel chatter is not for us
    if kind == "app_mention" and not thread_ts:
        thread_ts = ts  # a mention in a channel starts a thread under the mentioning message
    if bot_user:
        text = re.sub(rf"<@{re.escape(bot_user)}(\|[^>]*)?>\s*", "", text)
    return ChannelMessage(
        channel_type=ChannelType.SLACK,
        channel_id=channel,
        message_id=event_id,
        user_identifier=f"{team_id}:{user}",
        content=slack_text(text, names).strip(),
        timestamp=_timestamp(ts),
        thread_id=thread_ts,
        tenant=team_id,
        attachments=_attachments(event),
        forwarded=_shared_message(event, names or {}),
        # `ts`: where a resent reply's lookup starts reading (`sent.py`).
        reply_context={
            "channel": channel,
            "thread_ts": thread_ts or None,
            "team_id": team_id,
            "ts": ts,
        },
        raw=dict(envelope),
        conversation=conversation_of(channel, event.get("channel_type")),
    )


def parse_slack_shortcut(
    payload: Mapping[str, Any], names: Mapping[str, str] | None = None
) -> ChannelMessage:
    """The message behind a "Send to assistant" message shortcut: the shared message becomes
    `forwarded` content (author, channel, permalink) and the answer goes to the user's DM.

    Raises `ChannelPayloadError` when the payload lacks what a message shortcut has.
    """
    names = names or {}
    team = payload.get("team") or {}
    user = payload.get("user") or {}
    channel = payload.get("channel") or {}
    shared = payload.get("message") or {}
    trigger = payload.get("trigger_id")
    if not all(isinstance(part, Mapping) for part in (team, user, channel, shared)):
        raise ChannelPayloadError("a message shortcut needs 'team', 'user', 'channel', 'message'")
    user_id, team_id = user.get("id"), team.get("id") or user.get("team_id") or ""
    if not isinstance(user_id, str) or not user_id or not isinstance(trigger, str) or not trigger:
        raise ChannelPayloadError("a message shortcut needs 'user.id' and 'trigger_id'")
    ts = str(shared.get("ts") or payload.get("message_ts") or "")
    channel_id = str(channel.get("id") or "")
    author = str(shared.get("user") or shared.get("bot_id") or "")
    forwarded = ForwardedContent(
        sender=author,
        sender_name=names.get(author, author),
        subject=f"Slack message in #{channel.get('name') or channel_id}",
        date=_iso_date(ts),
        body=slack_text(str(shared.get("text") or ""), names),
        link=permalink(str(team.get("domain") or ""), channel_id, ts),
    )
    return ChannelMessage(
        channel_type=ChannelType.SLACK,
        # Posting to a user id delivers to the app's direct message with that user.
        channel_id=user_id,
        message_id=f"shortcut:{trigger}",
        user_identifier=f"{team_id}:{user_id}",
        content="Please look at this Slack message.",
        timestamp=_timestamp(str(payload.get("action_ts") or ts or "0")),
        tenant=str(team_id),
        attachments=_attachments(shared),
        forwarded=forwarded,
        reply_context={"channel": user_id, "thread_ts": None, "team_id": team_id},
        raw=dict(payload),
        # Posted to the user id, the answer lands in the app's direct message with the user.
        conversation=Conversation.DIRECT,
    )
