"""Alembic environment: migrations run on a connection handed in by `storage.database`.

The gateway applies migrations from inside its event loop (`Database.upgrade`), so this
environment never creates an engine of its own; it uses `config.attributes["connection"]`.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from storage.models import Base


def run_migrations(connection: Connection) -> None:
    """Run the migrations on `connection` inside one transaction."""
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `gateway db upgrade --config FILE`")
run_migrations(connection)
