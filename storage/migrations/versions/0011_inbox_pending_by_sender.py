"""inbox pending by sender: a user's unfinished events found among theirs alone

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 02:45:00

Every turn reads the oldest unfinished events of its user (`WHERE sender_key IN (…) AND
status = 'pending' ORDER BY id LIMIT n`). The statement is prepared, and while the table's
statistics were off (a new database, or one grown since autovacuum's last pass) its plan walked
(status, id) through every sender's pending events in queue order and filtered them by sender:
a read cost what the whole backlog cost (1,199 rows read for one, in an EXPLAIN of 1,300
pending events; 525 rows a message in a 10,000-user `bench/e2e.py` run whose backlog grew). By
(sender_key, id) over the pending events only, read once per sender key
(`storage.repositories.inbox._next_pending`), it is the user's own rows, whatever the backlog
or the statistics.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_index(
        "ix_inbound_events_pending_sender",
        "inbound_events",
        ["sender_key", "id"],
        sqlite_where=sa.text("status = 'pending'"),
        postgresql_where=sa.text("status = 'pending'"),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_inbound_events_pending_sender", table_name="inbound_events")
