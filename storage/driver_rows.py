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
whose server went away out of the pool, as for its own statements). The session's pending
changes to its objects are flushed first, as SQLAlchemy's autoflush does.

The statements every message runs go the same way, for the same reason (through an ORM
session a one-row lookup cost 1.4-1.7 CPU-ms and through the driver 0.85-0.93,
`bench/README.md`): the inbox's INSERT, the dispatcher's read of a user's queue, the user's
current session, the turn's writes (`storage.turn_store`, the session's channel, the reply's
outbox row) and the reply's delivery mark. A JSON column's value is bound as `JsonValue` and
read back decoded (`json_value`).

Only for statements whose columns are plain values (numbers, strings, bytes, timestamps,
JSON); everything else keeps SQLAlchemy.
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Json
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


@dataclass(frozen=True, slots=True)
class JsonValue:
    """A value for a JSON column, written as SQLAlchemy's JSON type writes it (`json.dumps`)."""

    value: Any


def json_value(column: Any) -> Any:
    """A JSON column's value as the driver returned it, decoded (psycopg decodes, SQLite
    returns the stored text)."""
    return json.loads(column) if isinstance(column, str | bytes) else column


def values_list(names: Sequence[str], count: int) -> str:
    """`count` rows of `:name_i` placeholders for a multi-row `VALUES`, with `numbered`."""
    return ", ".join(
        "(" + ", ".join(f":{name}_{row}" for name in names) + ")" for row in range(count)
    )


def numbered(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of `values_list`: each row's values under `name_i`."""
    return {
        f"{name}_{row}": value for row, values in enumerate(rows) for name, value in values.items()
    }


def _psycopg_value(value: Any) -> Any:
    return Json(value.value) if isinstance(value, JsonValue) else value


def _sqlite_value(value: Any) -> Any:
    if isinstance(value, JsonValue):
        return json.dumps(value.value)
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
        if session.new or session.dirty or session.deleted:
            # What the session's objects changed goes first, as SQLAlchemy's autoflush does
            # before its own statements: this one may read it, or be overwritten by it.
            await session.flush()
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
                await cursor.execute(
                    _psycopg_sql(sql), {k: _psycopg_value(v) for k, v in params.items()}
                )
                found = await cursor.fetchall() if cursor.description is not None else []
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
