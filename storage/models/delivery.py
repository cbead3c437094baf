"""The durable inbox and outbox: what the platforms sent, committed before they are
acknowledged, and the replies, committed before they are sent."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from storage.column_types import BigIntId, enum_column, utcnow
from storage.models.base import Base


class InboundStatus(enum.StrEnum):
    """Where an accepted inbound message is in its processing."""

    PENDING = "pending"
    DONE = "done"
    REJECTED = "rejected"
    FAILED = "failed"


class OutboundStatus(enum.StrEnum):
    """Delivery state of a reply."""

    PENDING = "pending"
    SENDING = "sending"
    DELIVERED = "delivered"
    FAILED = "failed"


class InboundEvent(Base):
    """The durable inbox: a platform message, committed before the platform is acknowledged."""

    __tablename__ = "inbound_events"
    __table_args__ = (
        UniqueConstraint("channel_type", "message_id"),
        Index("ix_inbound_events_status_id", "status", "id"),
        Index("ix_inbound_events_sender_status", "sender_key", "status"),
        # A user's queue (migration 0011): their pending events alone, in queue order.
        Index(
            "ix_inbound_events_pending_sender",
            "sender_key",
            "id",
            sqlite_where=text("status = 'pending'"),
            postgresql_where=text("status = 'pending'"),
        ),
        # Ids are queue order and feed cursors: SQLite must never reuse a deleted row's id.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    channel_type: Mapped[str] = mapped_column(String(16))
    message_id: Mapped[str] = mapped_column(String(512))
    # "channel_type:external id" of the sender: which user's queue the event joins.
    sender_key: Mapped[str] = mapped_column(String(400))
    status: Mapped[str] = enum_column(InboundStatus, InboundStatus.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    processed_at: Mapped[datetime | None]
    user_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    session_id: Mapped[str | None] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"), index=True
    )
    # Sequence number of the user message once it is in the transcript: a restarted turn
    # must not append it twice.
    appended_seq: Mapped[int | None] = mapped_column(Integer)
    # The platform message a streamed answer is being written into (the channel's handle,
    # `channels.live`): a restarted turn finishes it instead of posting a second reply.
    live_reply: Mapped[dict[str, Any] | None]
    message: Mapped[dict[str, Any]] = mapped_column(default=dict)
    raw_payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[str | None] = mapped_column(Text)


class OutboundMessage(Base):
    """The durable outbox: a reply committed first, then sent and retried until delivered."""

    __tablename__ = "outbound_messages"
    __table_args__ = (
        Index("ix_outbound_messages_status_next", "status", "next_attempt_at"),
        Index("ix_outbound_messages_channel_feed", "channel_type", "channel_id", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    message_id: Mapped[str] = mapped_column(String(512), unique=True)
    user_id: Mapped[str | None] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    session_id: Mapped[str | None] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"), index=True
    )
    inbound_event_id: Mapped[int | None] = mapped_column(
        ForeignKey("inbound_events.id", ondelete="SET NULL")
    )
    channel_type: Mapped[str] = mapped_column(String(16))
    channel_id: Mapped[str] = mapped_column(String(320))
    thread_id: Mapped[str] = mapped_column(String(512), default="")
    in_reply_to: Mapped[str | None] = mapped_column(String(512))
    # reply (to a message), rejection (to an unknown sender) or notice.
    kind: Mapped[str] = mapped_column(String(16), default="reply")
    content: Mapped[str] = mapped_column(Text)
    reply_context: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # A file sent with the reply (an export): filename, content_type, content.
    attachment: Mapped[dict[str, Any] | None]
    status: Mapped[str] = enum_column(OutboundStatus, OutboundStatus.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    platform_message_id: Mapped[str | None] = mapped_column(String(512))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None]
