"""inbound live reply: the platform message a streamed answer is being written into

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 04:00:00

A reply shown while it is written lives on one platform message before the turn commits. Its
handle (JSON, the channel's own: Slack's channel and ts, Teams' stream id) is stored with the
inbound message as soon as the platform message exists, so a turn restarted after a crash
finishes that message instead of posting a second one. NULL when nothing was streamed.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("inbound_events", sa.Column("live_reply", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("inbound_events") as batch:
        batch.drop_column("live_reply")
