"""The Slack channel. So far its pure half: Slack payloads to `ChannelMessage`s, no I/O.

`parse_slack_event` reads an Events API envelope (`event_callback`) and returns the message
the gateway should answer, or None for what it must ignore: its own and other bots' messages,
edits and deletions, and channel messages that do not mention it (a mention arrives as its own
`app_mention` event, so a `message` event that mentions the bot is ignored too, or it would be
answered twice). `slack_text` turns Slack's mrkdwn into plain text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from channels.base import Attachment, ChannelMessage, ChannelType
from storage.errors import ChannelPayloadError

IGNORED_SUBTYPES = frozenset(
    {"message_changed", "message_deleted", "bot_message", "channel_join", "channel_leave"}
)
_ENTITY = re.compile(r"<([^<>]+)>")


def slack_text(text: str, names: Mapping[str, str] | None = None) -> str:
    """Slack mrkdwn as plain text: mentions, channels, links and special mentions spelled out,
    HTML escapes undone. `names` maps user ids to display names."""
    names = names or {}

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1)
        target, _, label = inner.partition("|")
        if target.startswith("@"):
            return "@" + (label or names.get(target[1:], target[1:]))
        if target.startswith("#"):
            return "#" + (label or target[1:])
        if target.startswith("!subteam^"):
            return label or "@team"
        if target.startswith("!"):
            return "@" + (label or target[1:].split("^")[0])
        if target.startswith("mailto:"):
            return label or target.removeprefix("mailto:")
        if label and label != target:
            return f"{label} ({target})"
        return target

    return html.unescape(_ENTITY.sub(replace, text))


def _timestamp(ts: str) -> datetime:
    try:
        return datetime.fromtimestamp(float(ts), UTC)
    except (TypeError, ValueError) as exc:
        raise ChannelPayloadError(f"invalid Slack timestamp {ts!r}") from exc


def _bot_user_id(envelope: Mapping[str, Any]) -> str:
    for authorization in envelope.get("authorizations") or ():
        if isinstance(authorization, Mapping) and authorization.get("is_bot"):
            return str(authorization.get("user_id", ""))
    return ""


def _attachments(event: Mapping[str, Any]) -> tuple[Attachment, ...]:
    files = event.get("files") or ()
    return tuple(
        Attachment(
            filename=str(item.get("name") or item.get("title") or "file"),
            content_type=str(item.get("mimetype") or "application/octet-stream"),
            size=int(item.get("size") or 0),
            url=item.get("url_private"),
        )
        for item in files
        if isinstance(item, Mapping)
    )


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
    direct = event.get("channel_type") == "im" or channel.startswith("D")
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
        reply_context={"channel": channel, "thread_ts": thread_ts or None, "team_id": team_id},
        raw=dict(envelope),
    )


SLACK_TEXT_LIMIT = 3900  # Slack truncates message text past 4,000 characters
_CODE = re.compile(r"(```.*?```|`[^`\n]+`)", re.S)
# In this order: italics before bold, whose output (*x*) would otherwise read as italics.
_INLINE_RULES: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"\[([^\]]+)\]\((https?://[^)\s]+)\)"), r"<\2|\1>"),
    (re.compile(r"(?<![*\w])\*(?!\s)([^*\n]+?)\*(?![*\w])"), r"_\1_"),
    (re.compile(r"\*\*(.+?)\*\*|__(.+?)__"), lambda m: f"*{m.group(1) or m.group(2)}*"),
    (re.compile(r"~~(.+?)~~"), r"~\1~"),
    (re.compile(r"^#{1,6}\s+(.+)$", re.M), r"*\1*"),
)


def markdown_to_mrkdwn(markdown: str) -> str:
    """The model's Markdown as Slack mrkdwn: bold, italics, strike-through, links, headings;
    `&`, `<`, `>` escaped; code spans and blocks left as they are."""
    parts = _CODE.split(markdown)
    converted = []
    for index, part in enumerate(parts):
        if index % 2:  # a code span or block
            converted.append(part)
            continue
        # Escape first: the link rule below writes Slack's own <url|label> brackets.
        text = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        for pattern, replacement in _INLINE_RULES:
            text = pattern.sub(replacement, text)
        converted.append(text)
    return "".join(converted)


def split_for_slack(text: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """`text` in pieces of at most `limit` characters, cut at paragraph breaks, else at line
    breaks, else at spaces; never an empty piece."""
    pieces: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        window = rest[:limit]
        cut = max(window.rfind("\n\n"), 0) or max(window.rfind("\n"), 0) or window.rfind(" ")
        if cut <= 0:
            cut = limit
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        pieces.append(rest)
    return pieces
