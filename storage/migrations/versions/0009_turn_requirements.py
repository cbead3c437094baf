"""turn requirements: a function that makes a statement's condition an error

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29 06:20:00

A turn's writes go to PostgreSQL in one round trip with their `COMMIT`
(`storage.turn_store`): what the turn checked on the answers before committing (its event was
still pending, its session's last message number was still the one it read) is checked by the
statements themselves, through `gateway_require(ok, reason)`, which raises `reason` with
SQLSTATE `GW409` when `ok` is not true; the transaction is then aborted and the `COMMIT`
behind it does nothing. SQLite checks the answers before committing: nothing here.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION gateway_require(ok boolean, reason text) RETURNS boolean
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            IF ok IS NOT TRUE THEN
                RAISE EXCEPTION USING ERRCODE = 'GW409', MESSAGE = reason;
            END IF;
            RETURN true;
        END $$
        """
    )


def downgrade() -> None:
    """Revert this revision."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION IF EXISTS gateway_require(boolean, text)")
