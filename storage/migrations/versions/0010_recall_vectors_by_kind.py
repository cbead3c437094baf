"""recall vectors by kind: a user's vectors found by model and kind in entry order

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29 14:40:00

The in-process vector index reads a user's vectors of a kind group (turns; summaries and
compactions) newest first, and reads on from the last one it holds (`storage.vector_index`).
By (user_id, entry_id) alone, the summaries were found among every turn of the user, and
PostgreSQL's planner walked the table's primary key through other users' rows instead; by
(user_id, model, kind, entry_id) each read is one range of an index-only scan (the summaries'
two kinds two), whatever the history or the other users.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_index(
        "ix_recall_vectors_user_model_kind_entry",
        "recall_vectors",
        ["user_id", "model", "kind", "entry_id"],
    )
    op.drop_index("ix_recall_vectors_user_entry", table_name="recall_vectors")


def downgrade() -> None:
    """Revert this revision."""
    op.create_index("ix_recall_vectors_user_entry", "recall_vectors", ["user_id", "entry_id"])
    op.drop_index("ix_recall_vectors_user_model_kind_entry", table_name="recall_vectors")
