"""The recall index's portable tables: its entries (written by triggers) and their vectors."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from storage.column_types import BigIntId
from storage.models.base import Base


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
