"""SQLAlchemy models for the whole domain.

One table per concept: organizations and their users, the users' channel identities, sessions
and the channels/threads they span, the session transcript (messages), compactions, archived
session summaries, memory facts, the durable inbox and outbox, and leases for leader-elected
background jobs. The schema runs unchanged on SQLite and PostgreSQL; migrations in
`storage/migrations` create exactly these tables (a test compares the two).
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from storage.column_types import BigIntId, UTCDateTime, enum_column, utcnow

# Deterministic constraint names keep migrations identical on both databases.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with the project's naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[Any]: JSON(),
    }


class SessionStatus(enum.StrEnum):
    """Lifecycle states of a session (transitions are enforced in `sessions/`)."""

    ACTIVE = "active"
    COMPACTING = "compacting"
    ARCHIVED = "archived"
    EXPORTED = "exported"
    DELETED = "deleted"


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


class Organization(Base):
    """A tenant of the gateway; its `context` is given to the assistant for its users."""

    __tablename__ = "organizations"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    context: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class User(Base):
    """A person who talks to the assistant, on any number of channels."""

    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE"), index=True
    )
    display_name: Mapped[str] = mapped_column(String(200), default="")
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    provisioned: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UserChannelIdentity(Base):
    """One external identity (Slack `TEAM:USER`, AAD object id, email address, web id)."""

    __tablename__ = "user_channel_identities"
    __table_args__ = (UniqueConstraint("channel_type", "external_id"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    channel_type: Mapped[str] = mapped_column(String(16))
    external_id: Mapped[str] = mapped_column(String(320))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


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


class UserMemoryFact(Base):
    """A durable fact about a user (preference, name, commitment), deduplicated by `fact_key`."""

    __tablename__ = "user_memory_facts"
    __table_args__ = (UniqueConstraint("user_id", "fact_key"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    fact_key: Mapped[str] = mapped_column(String(64))
    fact: Mapped[str] = mapped_column(Text)
    category: Mapped[str] = mapped_column(String(32), default="fact")
    source_session_id: Mapped[str | None] = mapped_column(
        ForeignKey("sessions.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


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


class ExportLink(Base):
    """A download link for a user's export of one session; only the token's hash is kept."""

    __tablename__ = "export_links"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]


class JobLease(Base):
    """A lease naming the one process that runs a background job right now."""

    __tablename__ = "job_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime]


class RecallEntry(Base):
    """One searchable text of a user: a turn, a session summary or a compaction summary.

    Rows are written and removed by database triggers on `session_messages`,
    `session_summaries` and `session_compactions` (migration 0002), never by the application,
    so every writer keeps the index in step. The full-text structures over `body` are
    backend-specific and not modelled here: an FTS5 table on SQLite, a `tsvector` column with
    a GIN index of each user's lexemes on PostgreSQL, and per-user statistics on both
    (`recall_stats`, migrations 0002 and 0003; see `storage/recall_index.py`).
    """

    __tablename__ = "recall_entries"
    __table_args__ = (
        UniqueConstraint("kind", "source_id"),
        # A user's most recent entries of a kind: the window of a bounded recall search.
        Index("ix_recall_entries_user_kind_occurred_at", "user_id", "kind", "occurred_at"),
        Index("ix_recall_entries_session_seq", "session_id", "seq"),
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    # turn (a user or assistant message), summary (of a session) or compaction (its summary).
    kind: Mapped[str] = mapped_column(String(10))
    # The id of the message, summary or compaction row the text comes from.
    source_id: Mapped[int] = mapped_column(BigInteger)
    # The message's sequence number in its session (NULL for summaries).
    seq: Mapped[int | None] = mapped_column(Integer)
    speaker: Mapped[str] = mapped_column(String(200), default="")
    channel_type: Mapped[str] = mapped_column(String(16), default="")
    occurred_at: Mapped[datetime]
    body: Mapped[str] = mapped_column(Text)


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


class RecallVector(Base):
    """The embedding of one recall entry, for dense recall (`storage.recall_vectors`).

    Written by the application in the transaction that writes the entry's source row (the
    entry itself comes from a trigger; the vector needs the embedding model); removed with the
    entry (foreign key) and when the entry's text changes (a trigger of migration 0007), so no
    vector outlives or misdescribes its text. `gateway recall reindex` writes them all again.
    """

    __tablename__ = "recall_vectors"
    __table_args__ = (
        # A user's vectors of a model and kind in entry order: what the in-process index
        # reads, and reads on (migration 0010).
        Index("ix_recall_vectors_user_model_kind_entry", "user_id", "model", "kind", "entry_id"),
    )

    entry_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("recall_entries.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(10))
    # float16, little-endian, unit length; `model` names the embedding model that made it.
    model: Mapped[str] = mapped_column(String(40))
    vector: Mapped[bytes] = mapped_column(LargeBinary)
