"""memory changed: PostgreSQL tells every gateway process whose memory changed

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29 03:45:00

Each process keeps users' memory facts and recent summaries in a cache
(`sessions.context_cache.MemoryCache`). Any change to either table, by any process (a summary
job, compaction, a deletion from the admin CLI or API, `/forget`, the retention job), sends the
user's id on the `gateway_memory` channel when its transaction commits, and every process drops
its copy (`storage.memory_signal`). The server sends one notification per user and transaction
however many rows changed. SQLite runs one gateway process: nothing here.
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_TABLES = ("user_memory_facts", "session_summaries")


def upgrade() -> None:
    """Apply this revision."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION gateway_memory_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('gateway_memory', CASE TG_OP WHEN 'DELETE' THEN OLD.user_id
                                                           ELSE NEW.user_id END);
            RETURN NULL;
        END $$
        """
    )
    for table in _TABLES:
        op.execute(
            f"CREATE TRIGGER {table}_changed AFTER INSERT OR UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION gateway_memory_changed()"
        )


def downgrade() -> None:
    """Revert this revision."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in _TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_changed ON {table}")
    op.execute("DROP FUNCTION IF EXISTS gateway_memory_changed()")
