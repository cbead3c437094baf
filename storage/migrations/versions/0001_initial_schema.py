"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 02:20:47.662201
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "job_leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_job_leases")),
    )
    op.create_table(
        "organizations",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("context", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_organizations")),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("provisioned", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"],
            ["organizations.id"],
            name=op.f("fk_users_org_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
    )
    op.create_index(op.f("ix_users_org_id"), "users", ["org_id"], unique=False)

    op.create_table(
        "sessions",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("scope_channel", sa.String(length=16), nullable=True),
        sa.Column("status", sa.String(length=10), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_active_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("current_since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("message_count", sa.Integer(), nullable=False),
        sa.Column("user_message_count", sa.Integer(), nullable=False),
        sa.Column("assistant_message_count", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("context_tokens", sa.Integer(), nullable=False),
        sa.Column("compaction_count", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("topic_summary", sa.Text(), nullable=False),
        sa.Column("topics", sa.JSON(), nullable=False),
        sa.Column("skills_activated", sa.JSON(), nullable=False),
        sa.Column("transcript_ref", sa.String(length=512), nullable=True),
        sa.Column("forget_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_sessions_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    op.create_index(
        "ix_sessions_user_status_active",
        "sessions",
        ["user_id", "status", "last_active_at"],
        unique=False,
    )

    op.create_table(
        "user_channel_identities",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("channel_type", sa.String(length=16), nullable=False),
        sa.Column("external_id", sa.String(length=320), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_user_channel_identities_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_user_channel_identities")),
        sa.UniqueConstraint(
            "channel_type", "external_id", name=op.f("uq_user_channel_identities_channel_type")
        ),
    )
    op.create_index(
        op.f("ix_user_channel_identities_user_id"),
        "user_channel_identities",
        ["user_id"],
        unique=False,
    )

    op.create_table(
        "export_links",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_export_links_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_export_links_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_export_links")),
    )
    op.create_index(op.f("ix_export_links_user_id"), "export_links", ["user_id"], unique=False)

    op.create_table(
        "inbound_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("channel_type", sa.String(length=16), nullable=False),
        sa.Column("message_id", sa.String(length=512), nullable=False),
        sa.Column("sender_key", sa.String(length=400), nullable=False),
        sa.Column("status", sa.String(length=8), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("user_id", sa.String(length=64), nullable=True),
        sa.Column("session_id", sa.String(length=36), nullable=True),
        sa.Column("appended_seq", sa.Integer(), nullable=True),
        sa.Column("message", sa.JSON(), nullable=False),
        sa.Column("raw_payload", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_inbound_events_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_inbound_events_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inbound_events")),
        sa.UniqueConstraint(
            "channel_type", "message_id", name=op.f("uq_inbound_events_channel_type")
        ),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_inbound_events_sender_status", "inbound_events", ["sender_key", "status"], unique=False
    )
    op.create_index(
        op.f("ix_inbound_events_session_id"), "inbound_events", ["session_id"], unique=False
    )
    op.create_index("ix_inbound_events_status_id", "inbound_events", ["status", "id"], unique=False)

    op.create_table(
        "session_channels",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("channel_type", sa.String(length=16), nullable=False),
        sa.Column("channel_id", sa.String(length=320), nullable=False),
        sa.Column("thread_id", sa.String(length=512), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_message_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("message_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_session_channels_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_channels")),
        sa.UniqueConstraint(
            "session_id",
            "channel_type",
            "channel_id",
            "thread_id",
            name=op.f("uq_session_channels_session_id"),
        ),
    )
    op.create_index(
        "uq_session_channels_thread",
        "session_channels",
        ["channel_type", "channel_id", "thread_id"],
        unique=True,
        sqlite_where=sa.text("thread_id <> ''"),
        postgresql_where=sa.text("thread_id <> ''"),
    )

    op.create_table(
        "session_compactions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("first_message_seq", sa.Integer(), nullable=False),
        sa.Column("last_message_seq", sa.Integer(), nullable=False),
        sa.Column("messages_compacted", sa.Integer(), nullable=False),
        sa.Column("tokens_before", sa.Integer(), nullable=False),
        sa.Column("tokens_after", sa.Integer(), nullable=False),
        sa.Column("archive_ref", sa.String(length=512), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("facts", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_session_compactions_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_compactions")),
        sa.UniqueConstraint("session_id", "seq", name=op.f("uq_session_compactions_session_id")),
    )
    op.create_table(
        "session_messages",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("channel_type", sa.String(length=16), nullable=False),
        sa.Column("thread_id", sa.String(length=512), nullable=False),
        sa.Column("message_id", sa.String(length=512), nullable=True),
        sa.Column("in_reply_to", sa.String(length=512), nullable=True),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_session_messages_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_messages")),
        sa.UniqueConstraint("session_id", "seq", name=op.f("uq_session_messages_session_id")),
    )
    op.create_table(
        "session_summaries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("topics", sa.JSON(), nullable=False),
        sa.Column("message_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_session_summaries_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_session_summaries_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_summaries")),
        sa.UniqueConstraint("session_id", name=op.f("uq_session_summaries_session_id")),
    )
    op.create_index(
        op.f("ix_session_summaries_user_id"), "session_summaries", ["user_id"], unique=False
    )

    op.create_table(
        "user_memory_facts",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("fact_key", sa.String(length=64), nullable=False),
        sa.Column("fact", sa.Text(), nullable=False),
        sa.Column("category", sa.String(length=32), nullable=False),
        sa.Column("source_session_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["source_session_id"],
            ["sessions.id"],
            name=op.f("fk_user_memory_facts_source_session_id_sessions"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_user_memory_facts_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_user_memory_facts")),
        sa.UniqueConstraint("user_id", "fact_key", name=op.f("uq_user_memory_facts_user_id")),
    )
    op.create_table(
        "outbound_messages",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("message_id", sa.String(length=512), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=True),
        sa.Column("session_id", sa.String(length=36), nullable=True),
        sa.Column(
            "inbound_event_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.Column("channel_type", sa.String(length=16), nullable=False),
        sa.Column("channel_id", sa.String(length=320), nullable=False),
        sa.Column("thread_id", sa.String(length=512), nullable=False),
        sa.Column("in_reply_to", sa.String(length=512), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("reply_context", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=9), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("platform_message_id", sa.String(length=512), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["inbound_event_id"],
            ["inbound_events.id"],
            name=op.f("fk_outbound_messages_inbound_event_id_inbound_events"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_outbound_messages_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_outbound_messages_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbound_messages")),
        sa.UniqueConstraint("message_id", name=op.f("uq_outbound_messages_message_id")),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_outbound_messages_channel_feed",
        "outbound_messages",
        ["channel_type", "channel_id", "id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_outbound_messages_session_id"), "outbound_messages", ["session_id"], unique=False
    )
    op.create_index(
        "ix_outbound_messages_status_next",
        "outbound_messages",
        ["status", "next_attempt_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_outbound_messages_user_id"), "outbound_messages", ["user_id"], unique=False
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_outbound_messages_user_id"), table_name="outbound_messages")
    op.drop_index("ix_outbound_messages_status_next", table_name="outbound_messages")
    op.drop_index(op.f("ix_outbound_messages_session_id"), table_name="outbound_messages")
    op.drop_index("ix_outbound_messages_channel_feed", table_name="outbound_messages")

    op.drop_table("outbound_messages")
    op.drop_table("user_memory_facts")
    op.drop_index(op.f("ix_session_summaries_user_id"), table_name="session_summaries")

    op.drop_table("session_summaries")
    op.drop_table("session_messages")
    op.drop_table("session_compactions")
    op.drop_index(
        "uq_session_channels_thread",
        table_name="session_channels",
        sqlite_where=sa.text("thread_id <> ''"),
        postgresql_where=sa.text("thread_id <> ''"),
    )

    op.drop_table("session_channels")
    op.drop_index("ix_inbound_events_status_id", table_name="inbound_events")
    op.drop_index(op.f("ix_inbound_events_session_id"), table_name="inbound_events")
    op.drop_index("ix_inbound_events_sender_status", table_name="inbound_events")

    op.drop_table("inbound_events")
    op.drop_index(op.f("ix_export_links_user_id"), table_name="export_links")

    op.drop_table("export_links")
    op.drop_index(op.f("ix_user_channel_identities_user_id"), table_name="user_channel_identities")

    op.drop_table("user_channel_identities")
    op.drop_index("ix_sessions_user_status_active", table_name="sessions")

    op.drop_table("sessions")
    op.drop_index(op.f("ix_users_org_id"), table_name="users")

    op.drop_table("users")
    op.drop_table("organizations")
    op.drop_table("job_leases")
