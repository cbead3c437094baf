"""recall vectors: the embedding of every recall entry, for dense (hybrid) recall

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 03:40:00

One row per recall entry that has been embedded (`storage.recall_vectors`), removed with the
entry by its foreign key, and dropped by a trigger when the entry's text changes (the vector
would describe the old text; `gateway recall reindex` writes it again). The vectors of
existing entries are written by `gateway recall reindex`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_FORGET_ON_UPDATE = {
    "sqlite": (
        "CREATE TRIGGER recall_vectors_stale AFTER UPDATE OF body ON recall_entries "
        "BEGIN DELETE FROM recall_vectors WHERE entry_id = OLD.id; END"
    ),
    "postgresql": (
        """
        CREATE FUNCTION recall_vectors_stale() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM recall_vectors WHERE entry_id = OLD.id;
            RETURN NULL;
        END $$
        """
    ),
}


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "recall_vectors",
        sa.Column(
            "entry_id",
            sa.BigInteger(),
            sa.ForeignKey("recall_entries.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("user_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("model", sa.String(40), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_recall_vectors_user_entry", "recall_vectors", ["user_id", "entry_id"])
    dialect = op.get_bind().dialect.name
    op.execute(_FORGET_ON_UPDATE[dialect])
    if dialect == "postgresql":
        op.execute(
            "CREATE TRIGGER recall_vectors_stale AFTER UPDATE OF body ON recall_entries "
            "FOR EACH ROW WHEN (OLD.body IS DISTINCT FROM NEW.body) "
            "EXECUTE FUNCTION recall_vectors_stale()"
        )


def downgrade() -> None:
    """Revert this revision."""
    dialect = op.get_bind().dialect.name
    op.execute(
        "DROP TRIGGER IF EXISTS recall_vectors_stale"
        + (" ON recall_entries" if dialect == "postgresql" else "")
    )
    if dialect == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS recall_vectors_stale()")
    op.drop_index("ix_recall_vectors_user_entry", table_name="recall_vectors")
    op.drop_table("recall_vectors")
