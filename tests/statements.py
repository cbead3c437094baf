"""The statements a database's engine sends, recorded while a block runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from storage.database import Database


@contextmanager
def recorded_statements(
    database: Database, keep: Callable[[str], bool] = lambda _statement: True
) -> Iterator[list[str]]:
    """Every statement sent through the engine in the block that `keep` keeps, in order. Not
    among them: the `BEGIN` and `COMMIT` that psycopg sends itself on PostgreSQL, and
    SQLite's `COMMIT` (the driver's `commit()`); SQLite's `BEGIN IMMEDIATE` is one."""
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if keep(statement):
            statements.append(statement)

    event.listen(database.engine.sync_engine, "before_cursor_execute", seen)
    try:
        yield statements
    finally:
        event.remove(database.engine.sync_engine, "before_cursor_execute", seen)
