"""What the repositories share: session ids, batches for multi-row statements, and
INSERT … ON CONFLICT for either database."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession


def new_session_id() -> str:
    """A fresh, unguessable session id."""
    return uuid.uuid4().hex


# Rows per multi-row statement: well under SQLite's limit of bound parameters.
_BATCH = 500


def batches(items: Sequence[Any]) -> list[Sequence[Any]]:
    """`items` in runs of at most 500, for multi-row statements."""
    return [items[start : start + _BATCH] for start in range(0, len(items), _BATCH)]


def dialect_insert(session: AsyncSession, table: Any) -> Any:
    """INSERT for the session's database, with its ON CONFLICT clauses."""
    # INSERT … ON CONFLICT is dialect-specific in SQLAlchemy; both dialects spell it the same.
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)
