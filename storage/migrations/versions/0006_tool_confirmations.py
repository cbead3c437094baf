"""tool confirmations: tool calls waiting for the user's yes

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 04:00:00

A tool marked `confirm` is not run when the model calls it: the user is asked, and the call
waits here (one per session) for the session's next message, until `expires_at`. Deleting
the session or the user deletes it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "tool_confirmations",
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("tool_name", sa.String(length=200), nullable=False),
        sa.Column("tool_input", sa.JSON(), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_tool_confirmations_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_tool_confirmations_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_tool_confirmations")),
    )
    op.create_index(
        op.f("ix_tool_confirmations_user_id"), "tool_confirmations", ["user_id"], unique=False
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_tool_confirmations_user_id"), table_name="tool_confirmations")
    op.drop_table("tool_confirmations")
