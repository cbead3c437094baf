"""Sessions and what belongs to each: the channels and threads it spans, its messages, its
compactions, the summary it is archived with, the tool call waiting for a yes in it, and the
download links of its exports."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from storage.column_types import BigIntId, enum_column, utcnow
from storage.models.base import Base


class SessionStatus(enum.StrEnum):
    """Lifecycle states of a session (transitions are enforced in `sessions/`)."""

    ACTIVE = "active"
    COMPACTING = "compacting"
    ARCHIVED = "archived"
    EXPORTED = "exported"
    DELETED = "deleted"


class Session(Base):
    """A conversation of one user, possibly spanning channels, threads and days."""

    __tablename__ = "sessions"
    __table_args__ = (
        Index("ix_sessions_user_status_active", "user_id", "status", "last_active_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    org_id: Mapped[str] = mapped_column(String(64))
    # With `sessions.scope: channel` a session belongs to one channel type; NULL for scope user.
    scope_channel: Mapped[str | None] = mapped_column(String(16))
    status: Mapped[str] = enum_column(SessionStatus, SessionStatus.ACTIVE)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    last_active_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When the session last became the user's current one (created or resumed). A reply in
    # an old session's thread reactivates that session without making it current, so the
    # user's next message outside threads still goes where they were.
    current_since: Mapped[datetime] = mapped_column(default=utcnow)
    archived_at: Mapped[datetime | None]
    message_count: Mapped[int] = mapped_column(Integer, default=0)
    user_message_count: Mapped[int] = mapped_column(Integer, default=0)
    assistant_message_count: Mapped[int] = mapped_column(Integer, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    context_tokens: Mapped[int] = mapped_column(Integer, default=0)
    compaction_count: Mapped[int] = mapped_column(Integer, default=0)
    # Sequence numbers are handed out from here under the session's turn lock.
    last_seq: Mapped[int] = mapped_column(Integer, default=0)
    topic_summary: Mapped[str] = mapped_column(Text, default="")
    topics: Mapped[list[Any]] = mapped_column(default=list)
    skills_activated: Mapped[list[Any]] = mapped_column(default=list)
    transcript_ref: Mapped[str | None] = mapped_column(String(512))
    # Set by `/forget`; the deletion needs a confirmation soon after.
    forget_requested_at: Mapped[datetime | None]

    @property
    def tokens_used(self) -> int:
        """Input plus output tokens billed for this session so far."""
        return self.input_tokens + self.output_tokens


class SessionChannel(Base):
    """A channel (and thread) a session has spanned.

    A thread belongs to exactly one session: (channel_type, channel_id, thread_id) is unique
    whenever thread_id is set. A thread-less channel (a DM, the web page) is used by one session
    after another, so there it is unique per session only. `thread_id` is '' for no thread
    because NULLs never collide in a unique index.
    """

    __tablename__ = "session_channels"
    __table_args__ = (
        UniqueConstraint("session_id", "channel_type", "channel_id", "thread_id"),
        Index(
            "uq_session_channels_thread",
            "channel_type",
            "channel_id",
            "thread_id",
            unique=True,
            sqlite_where=text("thread_id <> ''"),
            postgresql_where=text("thread_id <> ''"),
        ),
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    channel_type: Mapped[str] = mapped_column(String(16))
    channel_id: Mapped[str] = mapped_column(String(320))
    thread_id: Mapped[str] = mapped_column(String(512), default="")
    joined_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_message_at: Mapped[datetime] = mapped_column(default=utcnow)
    message_count: Mapped[int] = mapped_column(Integer, default=0)


class SessionMessage(Base):
    """One message of a session's transcript, numbered gaplessly from 1 within the session."""

    __tablename__ = "session_messages"
    __table_args__ = (UniqueConstraint("session_id", "seq"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    channel_type: Mapped[str] = mapped_column(String(16))
    thread_id: Mapped[str] = mapped_column(String(512), default="")
    # The platform's id for user messages, ours for replies; replies name what they answer.
    message_id: Mapped[str | None] = mapped_column(String(512))
    in_reply_to: Mapped[str | None] = mapped_column(String(512))
    content: Mapped[str] = mapped_column(Text)
    tokens: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Tool use/result blocks and other structured content, rebuilt exactly on later turns.
    metadata_json: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)


class SessionCompaction(Base):
    """A compaction: which messages left the model's context and what replaced them."""

    __tablename__ = "session_compactions"
    __table_args__ = (UniqueConstraint("session_id", "seq"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    first_message_seq: Mapped[int] = mapped_column(Integer)
    last_message_seq: Mapped[int] = mapped_column(Integer)
    messages_compacted: Mapped[int] = mapped_column(Integer)
    tokens_before: Mapped[int] = mapped_column(Integer)
    tokens_after: Mapped[int] = mapped_column(Integer)
    archive_ref: Mapped[str] = mapped_column(String(512))
    summary: Mapped[str] = mapped_column(Text)
    facts: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SessionSummary(Base):
    """The summary written when a session is archived; feeds later sessions' context."""

    __tablename__ = "session_summaries"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"), unique=True
    )
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    summary: Mapped[str] = mapped_column(Text)
    topics: Mapped[list[Any]] = mapped_column(default=list)
    message_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ToolConfirmation(Base):
    """A tool call waiting for its user's yes: asked in a session's reply, run (or dropped)
    at that session's next message. One at a time per session; kept in the database so that
    a restart between the question and the answer changes nothing."""

    __tablename__ = "tool_confirmations"

    session_id: Mapped[str] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    tool_name: Mapped[str] = mapped_column(String(200))
    tool_input: Mapped[dict[str, Any]] = mapped_column(default=dict)
    question: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]


class ExportLink(Base):
    """A download link for a user's export of one session; only the token's hash is kept."""

    __tablename__ = "export_links"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
