"""Teams activities as `ChannelMessage`s: the pure half of the Teams channel, no I/O.

`parse_teams_activity` returns the message the gateway should answer, or None for an activity
it ignores; `ignore_reason` names the reason (the HTTP handler logs it, so parsing stays pure).
Answered are `message` activities in personal chats, and in channels and group chats only when
they @mention the bot (the mention is cut out of the text). `bot_was_added` recognises the
`conversationUpdate` that installs the bot, which gets a welcome instead of a turn.

Ids, as the gateway sees them: `channel_id` is the conversation id without the reply-chain
suffix (`19:…@thread.tacv2;messageid=1700000000000` → `19:…@thread.tacv2`); `thread_id` is
the reply chain's root message id in a channel ('' in personal and group chats, which have no
reply chains); `message_id` is `<channel_id>|<activity id>`, because Teams activity ids are
millisecond timestamps that are unique only within one conversation. `reply_context` holds a
Bot Framework conversation reference (JSON), enough to answer later, after restarts.
"""

from __future__ import annotations

import mimetypes
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from inscriptis import get_text  # type: ignore[import-untyped]  # (no type information)

from channels.base import Attachment, ChannelMessage, ChannelType, Conversation
from errors import ChannelPayloadError

REPLY_CHAIN_MARKER = ";messageid="
BOT_ID_PREFIX = "28:"  # Teams spells a bot's account id as 28:<app id>
_FILE_DOWNLOAD = "application/vnd.microsoft.teams.file.download.info"
_MENTION_TAG = re.compile(r"<at[^>]*>(.*?)</at>", re.I | re.S)
# Teams sends formatted messages as HTML; plain text may still contain a lone "<" or "&".
_HTML_HINT = re.compile(
    r"</?(p|div|span|br|b|i|u|s|strong|em|a|ul|ol|li|pre|code|blockquote|h[1-6]|table|tr|td|th|img)\b"
    r"|&(amp|lt|gt|quot|nbsp|#\d+);",
    re.I,
)


def split_conversation_id(conversation_id: str) -> tuple[str, str]:
    """The conversation id without its reply-chain suffix, and the chain's root id ('' if none)."""
    base, _, root = conversation_id.partition(REPLY_CHAIN_MARKER)
    return base, root


def teams_text(text: str, entities: Iterable[Any] = (), bot_ids: Iterable[str] = ()) -> str:
    """Message text as plain text: the bot's own @mentions removed, other mentions as `@Name`,
    HTML (formatted messages) converted with inscriptis."""
    bots = {bot for bot in bot_ids if bot}
    for entity in _mentions(entities):
        if _mentioned_id(entity) in bots and isinstance(entity.get("text"), str):
            text = re.sub(re.escape(entity["text"]) + r" ?", "", text)
    text = _MENTION_TAG.sub(lambda match: "@" + match.group(1).strip(), text)
    if _HTML_HINT.search(text):
        text = str(get_text(text))
    return text.strip()


def bot_ids_of(activity: Mapping[str, Any], bot_id: str) -> frozenset[str]:
    """Every spelling of the bot's id that a mention or a member list may use."""
    recipient = _mapping(activity.get("recipient"))
    ids = {bot_id, f"{BOT_ID_PREFIX}{bot_id}" if bot_id else "", str(recipient.get("id") or "")}
    return frozenset(value for value in ids if value)


def mentions_bot(activity: Mapping[str, Any], *, bot_id: str) -> bool:
    """Whether the activity @mentions the bot."""
    bots = bot_ids_of(activity, bot_id)
    return any(_mentioned_id(entity) in bots for entity in _mentions(activity.get("entities")))


def bot_was_added(activity: Mapping[str, Any], *, bot_id: str) -> bool:
    """Whether this is the `conversationUpdate` that adds the bot to a chat or team."""
    if activity.get("type") != "conversationUpdate":
        return False
    bots = bot_ids_of(activity, bot_id)
    members = activity.get("membersAdded") or ()
    return any(str(_mapping(member).get("id") or "") in bots for member in members)


def conversation_reference(activity: Mapping[str, Any]) -> dict[str, Any]:
    """The Bot Framework conversation reference (camelCase JSON) that addresses a reply."""
    conversation = _mapping(activity.get("conversation"))
    reference: dict[str, Any] = {
        "user": _account(activity.get("from")),
        "bot": _account(activity.get("recipient")),
        "conversation": {
            key: conversation[key]
            for key in ("id", "conversationType", "tenantId", "isGroup", "name")
            if conversation.get(key) is not None
        },
        "channelId": activity.get("channelId"),
        "locale": activity.get("locale"),
        "serviceUrl": activity.get("serviceUrl"),
    }
    if activity.get("type") == "message" and activity.get("id"):
        reference["activityId"] = activity["id"]  # replies attach to the user's message
    return {key: value for key, value in reference.items() if value is not None}


def tenant_of(activity: Mapping[str, Any]) -> str:
    """The sender's tenant id (`channelData.tenant.id`, else `conversation.tenantId`)."""
    tenant = _mapping(_mapping(activity.get("channelData")).get("tenant")).get("id")
    return str(tenant or _mapping(activity.get("conversation")).get("tenantId") or "")


def ignore_reason(activity: Mapping[str, Any], *, bot_id: str) -> str | None:
    """Why the gateway does not answer this activity, or None when it does."""
    kind = activity.get("type")
    if kind != "message":
        return f"activity type {kind!r} is not a message"
    sender = _mapping(activity.get("from"))
    if str(sender.get("id") or "") in bot_ids_of(activity, bot_id):
        return "sent by the bot itself"
    conversation = _mapping(activity.get("conversation"))
    if conversation.get("conversationType", "personal") != "personal" and not mentions_bot(
        activity, bot_id=bot_id
    ):
        return "channel or group chat message without a mention of the bot"
    if not sender.get("aadObjectId"):
        return "the sender has no AAD object id"
    text = teams_text(
        str(activity.get("text") or ""),
        activity.get("entities") or (),
        bot_ids_of(activity, bot_id),
    )
    if not text and not _attachments(activity):
        return "empty message"
    return None


def parse_teams_activity(
    activity: Mapping[str, Any], *, bot_id: str, received_at: datetime | None = None
) -> ChannelMessage | None:
    """The message in a Teams activity, or None when the gateway ignores it (see
    `ignore_reason` for why). `received_at` stands in for a missing activity timestamp.

    Raises `ChannelPayloadError` when a message activity lacks what every one has.
    """
    if ignore_reason(activity, bot_id=bot_id) is not None:
        return None
    activity_id = activity.get("id")
    conversation_id = _mapping(activity.get("conversation")).get("id")
    service_url = activity.get("serviceUrl")
    if not all(isinstance(value, str) and value for value in (activity_id, conversation_id)):
        raise ChannelPayloadError("a message activity needs 'id' and 'conversation.id'")
    if not isinstance(service_url, str) or not service_url:
        raise ChannelPayloadError("a message activity needs 'serviceUrl'")
    channel_id, root = split_conversation_id(str(conversation_id))
    sender = _mapping(activity.get("from"))
    return ChannelMessage(
        channel_type=ChannelType.TEAMS,
        channel_id=channel_id,
        message_id=f"{channel_id}|{activity_id}",
        user_identifier=str(sender["aadObjectId"]),
        content=teams_text(
            str(activity.get("text") or ""),
            activity.get("entities") or (),
            bot_ids_of(activity, bot_id),
        ),
        timestamp=_timestamp(activity.get("timestamp"), received_at),
        thread_id=_thread_root(activity, str(activity_id), root),
        tenant=tenant_of(activity),
        attachments=_attachments(activity),
        reply_context={
            "conversation_reference": conversation_reference(activity),
            "thread_root": _thread_root(activity, str(activity_id), root),
        },
        raw=dict(activity),
        conversation=_conversation(activity),
    )


def _conversation(activity: Mapping[str, Any]) -> Conversation:
    """A personal chat that is not a group is the only private kind; anything else is shared."""
    conversation = _mapping(activity.get("conversation"))
    kind = conversation.get("conversationType")
    if kind == "personal" and not conversation.get("isGroup"):
        return Conversation.DIRECT
    if kind == "channel":
        return Conversation.CHANNEL
    return (
        Conversation.GROUP
        if kind == "groupChat" or conversation.get("isGroup")
        else Conversation.CHANNEL
    )


def _thread_root(activity: Mapping[str, Any], activity_id: str, root_from_id: str) -> str:
    conversation = _mapping(activity.get("conversation"))
    if conversation.get("conversationType") != "channel":
        return ""  # personal and group chats have no reply chains
    # A top-level channel post starts a reply chain rooted at itself.
    return root_from_id or str(activity.get("replyToId") or "") or activity_id


def _timestamp(value: object, received_at: datetime | None) -> datetime:
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError as exc:
            raise ChannelPayloadError(f"invalid activity timestamp {value!r}") from exc
        if parsed.tzinfo is not None:
            return parsed
    if received_at is None:
        raise ChannelPayloadError("a message activity needs a timezone-aware 'timestamp'")
    return received_at


def _attachments(activity: Mapping[str, Any]) -> tuple[Attachment, ...]:
    found = []
    for value in activity.get("attachments") or ():
        item = _mapping(value)
        content_type = str(item.get("contentType") or "application/octet-stream")
        if content_type == "text/html":
            continue  # the HTML rendering of the message text itself, not a file
        name = str(item.get("name") or "attachment")
        content = _mapping(item.get("content"))
        source = _file_source(item, content, activity.get("serviceUrl"))
        if content_type == _FILE_DOWNLOAD:
            content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        url = content.get("downloadUrl") or item.get("contentUrl")
        found.append(
            Attachment(
                filename=name,
                content_type=content_type,
                size=0,  # Teams does not say
                url=str(url) if url else None,
                source=source,
            )
        )
    return tuple(found)


def _file_source(
    item: Mapping[str, Any], content: Mapping[str, Any], service_url: object
) -> dict[str, Any]:
    """What fetching the file needs (`channels.teams.files`): a OneDrive/SharePoint file's
    pre-authenticated `downloadUrl`, or an inline image's `contentUrl` with the service URL
    whose host serves it to the bot; nothing for cards and other attachments."""
    download = content.get("downloadUrl")
    if item.get("contentType") == _FILE_DOWNLOAD and isinstance(download, str) and download:
        return {"teams_download": download}
    url = item.get("contentUrl")
    if str(item.get("contentType") or "").startswith("image/") and isinstance(url, str) and url:
        return {"teams_content": url, "service_url": str(service_url or "")}
    return {}


def _mentions(entities: object) -> list[Mapping[str, Any]]:
    if not isinstance(entities, Iterable) or isinstance(entities, str | bytes | Mapping):
        return []
    return [
        entity
        for entity in entities
        if isinstance(entity, Mapping) and str(entity.get("type", "")).lower() == "mention"
    ]


def _mentioned_id(entity: Mapping[str, Any]) -> str:
    return str(_mapping(entity.get("mentioned")).get("id") or "")


def _account(value: object) -> dict[str, Any]:
    account = _mapping(value)
    return {key: account[key] for key in ("id", "name", "aadObjectId") if account.get(key)}


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
