"""What every channel speaks: the normalised inbound message and the reply.

Adapters (`channels/<type>/adapter.py`) turn a platform payload into a `ChannelMessage` with a
pure `parse_*` function (`channels/<type>/parse.py`), hand it to the gateway's inbox, and later
send `OutboundMessage`s back; `channels.plugin` draws how a channel plugs into the gateway.
Nothing here touches the database or the language model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse

from errors import ChannelPayloadError, RejectedRequestError


class ChannelType(StrEnum):
    """The channels the gateway speaks."""

    SLACK = "slack"
    TEAMS = "teams"
    EMAIL = "email"
    WEB = "web"


class Conversation(StrEnum):
    """Who reads the replies to a message, as its channel's parser knows it.

    Only `DIRECT` is private (the sender alone reads the replies: a Slack DM, a Teams personal
    chat, email, the web page); anything else, or not known, is shared with others.
    """

    DIRECT = "direct"
    GROUP = "group"  # a group DM or group chat
    CHANNEL = "channel"  # a channel, or a thread in one


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file that came with a message: its metadata, and where its bytes are fetched from
    once the message is accepted (`channels.files`)."""

    filename: str
    content_type: str
    size: int
    url: str | None = None
    # How the bytes are fetched after acceptance, as JSON values: `{"stash": key}` for bytes
    # the channel held at acceptance (mail parts, web uploads: `channels.files.FileStash`),
    # otherwise what the channel's own `fetch_attachment` needs (Slack's file id and
    # download URL, Teams' download URL). Empty: the bytes cannot be fetched.
    source: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ForwardedContent:
    """A message the user forwarded or shared, kept apart from what the user wrote."""

    sender: str
    sender_name: str = ""
    subject: str = ""
    date: str = ""
    body: str = ""
    link: str = ""


@dataclass(frozen=True, slots=True)
class ChannelMessage:
    """One inbound message, the same shape for every channel.

    `message_id` is the platform's own id (the dedupe key within `channel_type`);
    `user_identifier` the sender's external id (Slack `TEAM:USER`, AAD object id, email
    address, web user id); `conversation` who reads the replies; `subject` the subject line
    where the channel has one (email); `reply_context` whatever the adapter needs to answer in
    the right place, opaque to the gateway; `raw` the original payload, kept for audit and
    replays.
    """

    channel_type: ChannelType
    channel_id: str
    message_id: str
    user_identifier: str
    content: str
    timestamp: datetime
    thread_id: str = ""
    tenant: str = ""
    attachments: tuple[Attachment, ...] = ()
    forwarded: ForwardedContent | None = None
    reply_context: Mapping[str, Any] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict)
    # Message ids this one answers (email In-Reply-To/References); route to their session.
    references: tuple[str, ...] = ()
    conversation: Conversation = Conversation.CHANNEL
    subject: str = ""

    @property
    def is_private(self) -> bool:
        """Whether only the sender reads the replies to this message."""
        return self.conversation is Conversation.DIRECT

    def to_record(self) -> dict[str, Any]:
        """A JSON-serialisable dict without `raw` (which is stored on its own). Field by
        field: `asdict` copied the whole platform payload only for it to be dropped (half
        of what accepting a Slack event cost past the HTTP layer)."""
        return {
            "channel_type": self.channel_type.value,
            "channel_id": self.channel_id,
            "message_id": self.message_id,
            "user_identifier": self.user_identifier,
            "content": self.content,
            "timestamp": self.timestamp.astimezone(UTC).isoformat(),
            "thread_id": self.thread_id,
            "tenant": self.tenant,
            "attachments": tuple(asdict(attachment) for attachment in self.attachments),
            "forwarded": asdict(self.forwarded) if self.forwarded is not None else None,
            "reply_context": dict(self.reply_context),
            "references": self.references,
            "conversation": self.conversation.value,
            "subject": self.subject,
        }

    @classmethod
    def from_record(
        cls, record: Mapping[str, Any], raw: Mapping[str, Any] | None = None
    ) -> ChannelMessage:
        """Rebuild a message stored with `to_record`."""
        forwarded = record.get("forwarded")
        return cls(
            channel_type=ChannelType(record["channel_type"]),
            channel_id=record["channel_id"],
            message_id=record["message_id"],
            user_identifier=record["user_identifier"],
            content=record["content"],
            timestamp=datetime.fromisoformat(record["timestamp"]),
            thread_id=record.get("thread_id", ""),
            tenant=record.get("tenant", ""),
            attachments=tuple(
                Attachment(**{**item, "source": dict(item.get("source") or {})})
                for item in record.get("attachments", ())
            ),
            forwarded=ForwardedContent(**forwarded) if forwarded else None,
            reply_context=dict(record.get("reply_context", {})),
            raw=dict(raw or {}),
            references=tuple(record.get("references", ())),
            # Stored before the field existed: shared, so nothing private is shown by mistake.
            conversation=Conversation(record.get("conversation", Conversation.CHANNEL)),
            subject=record.get("subject", "") or _legacy_subject(record),
        )

    def prompt_text(self) -> str:
        """The text the assistant sees: what the user wrote plus any forwarded message."""
        parts = [self.content.strip()] if self.content.strip() else []
        if self.forwarded is not None:
            header = f"Forwarded message from {self.forwarded.sender_name or self.forwarded.sender}"
            details = [header]
            if self.forwarded.subject:
                details.append(f"Subject: {self.forwarded.subject}")
            if self.forwarded.date:
                details.append(f"Date: {self.forwarded.date}")
            details.append("")
            details.append(self.forwarded.body.strip())
            parts.append("\n".join(details))
        if self.attachments:
            parts.append(attachments_line(self.attachments))
        return "\n\n".join(parts)


def attachments_line(attachments: Sequence[Attachment]) -> str:
    """The line of a message's text that names its files (`ChannelMessage.prompt_text`)."""
    names = ", ".join(
        f"{item.filename} ({item.content_type}, {item.size} bytes)" for item in attachments
    )
    return f"Attachments: {names}"


@dataclass(frozen=True, slots=True)
class FileToSend:
    """A file that goes with a reply (a user's `/export`), where the channel can carry one."""

    filename: str
    content_type: str
    content: str


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """A reply to send: where (channel, thread, reply context) and what."""

    message_id: str
    channel_type: ChannelType
    channel_id: str
    content: str
    user_id: str | None = None
    thread_id: str = ""
    in_reply_to: str | None = None
    reply_context: Mapping[str, Any] = field(default_factory=dict)
    file: FileToSend | None = None
    # An earlier attempt may have reached the platform: its sender died between sending and
    # marking the reply delivered. An adapter that can ask the platform what it holds of the
    # reply does so before sending again (Slack), so that the retry sends only what is missing.
    resumed: bool = False


@dataclass(frozen=True, slots=True)
class DeliveryReceipt:
    """The platform accepted a reply; `platform_message_id` is its id there, if it has one."""

    platform_message_id: str | None = None


@dataclass(frozen=True, slots=True)
class AcceptResult:
    """What the inbox did with a message: stored it (`accepted`) or recognised a duplicate."""

    accepted: bool
    message_id: str


class InboxPort(Protocol):
    """Where adapters hand inbound messages; returns only after the message is committed."""

    async def accept(self, message: ChannelMessage) -> AcceptResult:
        """Store the message durably (or recognise it as a duplicate); raise `StorageError`."""
        ...


def _legacy_subject(record: Mapping[str, Any]) -> str:
    subject = record.get("reply_context", {}).get("subject")
    return subject if isinstance(subject, str) else ""


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body; `RejectedRequestError` (413) when it declares or turns out to be
    larger than `limit` bytes (a declared length is refused before anything is read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RejectedRequestError(413, f"the body is larger than {limit} bytes")
    raw = await request.body()
    if len(raw) > limit:
        raise RejectedRequestError(413, f"the body is larger than {limit} bytes")
    return raw


class RefusalResponse(JSONResponse):
    """`{"error": reason}` with the refusal's status. Rendered ASCII-only: a reason quoting
    the request (a tenant id, a header) may hold a lone UTF-16 surrogate that the request's
    JSON carried, which UTF-8 cannot encode; escaped, it is valid JSON all the same."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__({"error": reason}, status_code=status)

    def render(self, content: Any) -> bytes:
        """The JSON of `content`, every non-ASCII character escaped."""
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def parse_json(raw: bytes | str) -> Any:
    """A request body's JSON, or `ChannelPayloadError` with the reason: also for bodies that are
    not UTF-8, nest too deeply or hold integers too long to convert, which `json.loads` reports
    with other errors than `JSONDecodeError`."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ChannelPayloadError(f"the body is not valid JSON: {reason}") from exc
