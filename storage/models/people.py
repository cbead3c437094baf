"""Organizations, their users, the users' channel identities and what is remembered of them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from storage.column_types import BigIntId, utcnow
from storage.models.base import Base


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
