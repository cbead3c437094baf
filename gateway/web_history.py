"""The web page's conversation after a reload: the user's own web messages and the replies.

The replies are the feed's (the outbox rows to the user's web address); the user's messages
are what the sessions stored (`session_messages`, role user, channel web), so a deleted
session's messages and replies are gone from the history as from everywhere else. A message
still being answered is not in it yet: it is stored with its reply. A message that brought
files shows what the user wrote and the files' names, not the files' text stored with it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from channels.base import Attachment, ChannelType, attachments_line
from gateway.outbox import feed_item
from storage.database import Database
from storage.repositories.outbox import OutboxRepository
from storage.repositories.sessions import OwnMessage, SessionRepository
from storage.repositories.users import UserRepository


class WebHistory:
    """`channels.plugin.ConversationHistory` of the web channel, read from the database."""

    def __init__(self, database: Database) -> None:
        self.database = database

    async def history(self, channel_id: str, *, limit: int) -> tuple[list[dict[str, Any]], int]:
        """The last `limit` messages of the web user `channel_id`, oldest first, and the feed
        cursor after the newest reply (where the page's feed continues)."""
        channel = ChannelType.WEB.value
        prefix = f"{channel_id}:"  # web message ids are scoped to their user
        async with self.database.session() as db:
            replies = await OutboxRepository(db).latest(channel, channel_id, limit=limit)
            user = await UserRepository(db).find_by_identity(channel, channel_id)
            own = (
                await SessionRepository(db).user_messages_on(
                    user.id, channel, message_id_prefix=prefix, limit=limit
                )
                if user is not None
                else []
            )
        cursor = replies[0].id if replies else 0
        answered = {reply.in_reply_to: reply.created_at for reply in replies if reply.in_reply_to}
        timeline = [(reply.created_at, 1, feed_item(reply, channel_id)) for reply in replies]
        timeline.extend(
            (_shown_at(message, answered), 0, _user_item(message, prefix)) for message in own
        )
        timeline.sort(key=lambda entry: (entry[0], entry[1]))
        return [item for _, _, item in timeline[-limit:]], cursor


def _shown_at(message: OwnMessage, answered: dict[str, datetime]) -> datetime:
    """Where a user's message belongs in time: never after its reply (both are stored in one
    transaction, but a reply is what the user saw first only if it is older)."""
    reply_at = answered.get(message.message_id or "")
    return min(message.created_at, reply_at) if reply_at is not None else message.created_at


def _user_item(message: OwnMessage, prefix: str) -> dict[str, Any]:
    """A user's message in the shape of a feed item (`role` user, the client's own id); one
    that brought files has their names in `attachments` too."""
    files = [
        Attachment(record["filename"], record["content_type"], record["size"])
        for record in (message.metadata or {}).get("attachments", ())
    ]
    item: dict[str, Any] = {
        "message_id": (message.message_id or "").removeprefix(prefix),
        "role": "user",
        "text": _own_text(message.content, files),
        "session_id": message.session_id,
        "thread_id": message.thread_id or None,
        "in_reply_to": None,
        "created_at": message.created_at.isoformat(),
    }
    if files:
        item["attachments"] = [file.filename for file in files]
    return item


def _own_text(content: str, files: list[Attachment]) -> str:
    """What the user wrote: the stored text ends with the line naming the files and their
    text (`ChannelMessage.prompt_text`, `sessions.files`)."""
    if not files:
        return content
    own, found, _ = content.partition(attachments_line(files))
    return own.rstrip() if found else content
