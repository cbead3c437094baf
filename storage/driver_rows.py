"""Rows of a text statement read through the database driver itself, as plain tuples.

Recall's search runs a few statements per turn, each returning up to a few hundred rows of
plain columns. Through SQLAlchemy, each statement cost about 0.3 ms of the event loop's CPU
(psycopg alone: 0.13-0.15 ms) and each row a few microseconds more (its result machinery, a
`Row`, the type processing of its timestamp); on SQLite, three hops to the connection's
thread. Reading them through the driver cut a context assembly's event-loop CPU by about 17 %
on PostgreSQL and 28 % on SQLite (`bench/README.md`). So these statements run on the
session's own connection (inside its transaction, after whatever it did before) through
`rows`, which takes SQLAlchemy's `:name` placeholders and aware datetimes as every other
statement does, returns timestamps aware in UTC, and raises `StorageError` for the driver's
errors (the session's rollback then meets the same error, and SQLAlchemy takes a connection
whose server went away out of the pool, as for its own statements).

Only for statements whose columns are plain values (numbers, strings, bytes, timestamps);
everything else keeps SQLAlchemy.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError

# A string literal (left as it is), or one of SQLAlchemy's `:name` placeholders (not the
# `::type` casts of PostgreSQL).
_LITERAL_OR_PLACEHOLDER = re.compile(r"('(?:[^']|'')*')|(?<![:\w]):([A-Za-z_]\w*)")
# How SQLAlchemy writes a datetime into SQLite (its DATETIME type's storage format), so that
# the strings compare as the stored ones do.
_SQLITE_DATETIME = "%Y-%m-%d %H:%M:%S.%f"


@functools.lru_cache(maxsize=512)
def _psycopg_sql(sql: str) -> str:
    """`sql` with psycopg's `%(name)s` placeholders (and its literal `%` doubled)."""
    return _LITERAL_OR_PLACEHOLDER.sub(
        lambda match: match[1] or f"%({match[2]})s", sql.replace("%", "%%")
    )


def _sqlite_value(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime given for a UTC timestamp")
        return value.astimezone(UTC).strftime(_SQLITE_DATETIME)
    return value


def utc(value: datetime | str) -> datetime:
    """A timestamp column's value as the driver returned it, aware in UTC (SQLite returns
    the stored string, PostgreSQL an aware value in the connection's time zone)."""
    if isinstance(value, str):
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value if value.tzinfo is UTC else value.astimezone(UTC)


async def rows(
    session: AsyncSession, sql: str, params: Mapping[str, Any], *, timestamps: Sequence[int] = ()
) -> list[tuple[Any, ...]]:
    """Run `sql` on the session's connection; its rows as tuples, the columns at the
    positions `timestamps` aware in UTC."""
    try:
        connection = await session.connection()
        raw = (await connection.get_raw_connection()).driver_connection
    except SQLAlchemyError as exc:
        raise StorageError(f"database error: {exc.__class__.__name__}") from exc
    if raw is None:
        raise StorageError("database error: the connection is closed")
    try:
        if connection.dialect.name == "sqlite":
            # One hop to the connection's thread, not three (execute, fetch, close).
            found = await raw.execute_fetchall(
                sql, {k: _sqlite_value(v) for k, v in params.items()}
            )
        else:
            async with raw.cursor() as cursor:
                await cursor.execute(_psycopg_sql(sql), params)
                found = await cursor.fetchall()
    except (psycopg.Error, sqlite3.Error) as exc:
        lines = str(exc).strip().splitlines()
        raise StorageError(f"database error: {lines[0] if lines else type(exc).__name__}") from exc
    if not timestamps:
        return [tuple(row) for row in found]
    converted: list[tuple[Any, ...]] = []
    for row in found:
        values = list(row)
        for position in timestamps:
            if values[position] is not None:
                values[position] = utc(values[position])
        converted.append(tuple(values))
    return converted
