"""outbound attachment: a reply's file (an export) in a column of its own

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 03:00:00

A reply's file rode in its reply context under the key `attachment`; the reply context is the
channel's own (opaque to the gateway), so the file moves to `outbound_messages.attachment`
(JSON: filename, content_type, content; NULL without a file). Pending rows written before this
revision are moved over, so their file is still sent.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

OLD_KEY = "attachment"

outbound = sa.table(
    "outbound_messages",
    sa.column("id", sa.BigInteger),
    sa.column("reply_context", sa.JSON),
    sa.column("attachment", sa.JSON),
)


def _loaded(value: object) -> object:
    return json.loads(value) if isinstance(value, str) else value


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("outbound_messages", sa.Column("attachment", sa.JSON(), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(outbound.c.id, outbound.c.reply_context).where(
            sa.cast(outbound.c.reply_context, sa.Text).like(f'%"{OLD_KEY}"%')
        )
    ).all()
    for row_id, stored in rows:
        context = _loaded(stored)
        if not isinstance(context, dict) or not isinstance(context.get(OLD_KEY), dict):
            continue
        attachment = context.pop(OLD_KEY)
        bind.execute(
            outbound.update()
            .where(outbound.c.id == row_id)
            .values(reply_context=context, attachment=attachment)
        )


def downgrade() -> None:
    """Revert this revision (files go back into the reply context)."""
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(outbound.c.id, outbound.c.reply_context, outbound.c.attachment).where(
            outbound.c.attachment.is_not(None)
        )
    ).all()
    for row_id, stored, attachment in rows:
        context = _loaded(stored)
        context = dict(context) if isinstance(context, dict) else {}
        context[OLD_KEY] = _loaded(attachment)
        bind.execute(outbound.update().where(outbound.c.id == row_id).values(reply_context=context))
    with op.batch_alter_table("outbound_messages") as batch:
        batch.drop_column("attachment")
