"""The values a turn of the gateway works with: a queued event, its live reply and the turn's
settings; and the inbound message as session routing, the live reply and the stored message
see it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from channels.base import ChannelMessage
from channels.files import FileLimits
from channels.live import ReplyTarget
from channels.plugin import ChannelAdapter
from gateway.identity import ResolvedUser
from sessions.progress import TurnProgress
from sessions.routing import Arrival, RoutingPolicy
from storage.repositories.inbox import PendingEvent
from storage.repositories.session_state import CurrentSessions


@dataclass(frozen=True, slots=True)
class QueuedEvent:
    """An accepted message waiting in a user's queue."""

    event_id: int
    message: ChannelMessage
    # The live platform message an earlier attempt at this event streamed into, if any.
    live: Mapping[str, Any] | None = None
    # The user's current sessions, read with the queue under the turn lock: the first event
    # of a read only (its turn routes by them without reading them again).
    current: CurrentSessions | None = None

    @classmethod
    def of(cls, row: PendingEvent) -> QueuedEvent:
        """The value of an inbox row as a user's queue reads it."""
        return cls(row.id, ChannelMessage.from_record(row.message), row.live_reply or None)


@dataclass(slots=True)
class TurnLive:
    """A turn's live reply: where it goes, the channel showing it, its progress."""

    target: ReplyTarget
    adapter: ChannelAdapter | None
    progress: TurnProgress
    ended: bool = False


FILE_TURNS = 8  # turns holding files' bytes at once (up to files.max_message_mb each)


@dataclass(frozen=True, slots=True)
class TurnSettings:
    """The config values a turn depends on."""

    routing: RoutingPolicy
    history_budget_tokens: int
    # Channels whose clients fetch their replies (the web feed): no send step, no outbox pass.
    pull_channels: frozenset[str] = frozenset()
    # Base of links sent to users (exports); empty for links relative to this server.
    public_url: str = ""
    # What live replies say while the assistant works, by `sessions.progress.StatusKind`.
    status_texts: Mapping[str, str] = field(default_factory=dict)
    # How much the files of a message may bring.
    files: FileLimits = field(default_factory=FileLimits)


def arrival_of(message: ChannelMessage, user: ResolvedUser) -> Arrival:
    """The message as session routing sees it."""
    return Arrival(
        user_id=user.user_id,
        org_id=user.org_id,
        channel_type=message.channel_type.value,
        channel_id=message.channel_id,
        thread_id=message.thread_id,
        references=message.references,
    )


def reply_target(message: ChannelMessage, user: ResolvedUser) -> ReplyTarget:
    """Where the message's live reply goes."""
    return ReplyTarget(
        channel_id=message.channel_id,
        thread_id=message.thread_id,
        reply_context=message.reply_context,
        user_id=user.user_id,
        user_identifier=message.user_identifier,
        in_reply_to=message.message_id,
        conversation=message.conversation,
    )


def message_metadata(message: ChannelMessage) -> dict[str, object]:
    """What is stored with the user's message: the channel id, forwarded headers and the
    attachments' names."""
    metadata: dict[str, object] = {"channel_id": message.channel_id}
    if message.forwarded is not None:
        metadata["forwarded"] = {
            "sender": message.forwarded.sender,
            "subject": message.forwarded.subject,
            "date": message.forwarded.date,
        }
    if message.attachments:
        metadata["attachments"] = [
            {"filename": a.filename, "content_type": a.content_type, "size": a.size}
            for a in message.attachments
        ]
    return metadata
