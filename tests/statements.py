"""The statements a database's engine sends, recorded while a block runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

from sqlalchemy import event

from storage import driver_rows
from storage.database import Database


@contextmanager
def recorded_statements(
    database: Database, keep: Callable[[str], bool] = lambda _statement: True
) -> Iterator[list[str]]:
    """Every statement sent through the engine in the block that `keep` keeps, in order,
    those of the ORM and Core and those run through the driver (`storage.driver_rows`) alike.
    Not among them: the `BEGIN` and `COMMIT` that psycopg sends itself on PostgreSQL, and
    SQLite's `COMMIT` (the driver's `commit()`); SQLite's `BEGIN IMMEDIATE` is one."""
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if keep(statement):
            statements.append(statement)

    execute = driver_rows._execute
    send = driver_rows.send

    async def executed(
        raw: Any, sqlite: bool, sql: str, params: Mapping[str, Any], timestamps: Sequence[int]
    ) -> list[tuple[Any, ...]]:
        seen(None, None, sql)
        return await execute(raw, sqlite, sql, params, timestamps)

    async def sent(
        session: driver_rows.DriverScope, sql: str, params: Mapping[str, Any], **kwargs: Any
    ) -> driver_rows.Sent:
        before = len(statements)
        result = await send(session, sql, params, **kwargs)
        if len(statements) == before:  # pipelined: `_execute` did not run it
            seen(None, None, sql)
        return result

    event.listen(database.engine.sync_engine, "before_cursor_execute", seen)
    try:
        with ExitStack() as patches:
            patches.enter_context(mock.patch.object(driver_rows, "_execute", executed))
            patches.enter_context(mock.patch.object(driver_rows, "send", sent))
            yield statements
    finally:
        event.remove(database.engine.sync_engine, "before_cursor_execute", seen)
