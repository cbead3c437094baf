"""The values of driver statements (`storage.driver_rows`): SQLAlchemy's `:name`
placeholders turned into psycopg's, parameters bound as each driver takes them (JSON, aware
timestamps), multi-row `VALUES` lists, and the columns read back (timestamps aware in UTC,
JSON decoded)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Json

from errors import StorageError

# A string literal (left as it is), or one of SQLAlchemy's `:name` placeholders (not the
# `::type` casts of PostgreSQL).
_LITERAL_OR_PLACEHOLDER = re.compile(r"('(?:[^']|'')*')|(?<![:\w]):([A-Za-z_]\w*)")
# How SQLAlchemy writes a datetime into SQLite (its DATETIME type's storage format), so that
# the strings compare as the stored ones do.
_SQLITE_DATETIME = "%Y-%m-%d %H:%M:%S.%f"


@functools.lru_cache(maxsize=512)
def psycopg_sql(sql: str) -> str:
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


def prefixed(sql: str, prefix: str, shared: Mapping[str, str] | None = None) -> str:
    """`sql` with `prefix` before the name of each of its `:name` placeholders, but those
    named in `shared`, which take the name given there: statements made parts of one (`WITH
    a AS (…), b AS (…)`) keep their parameters apart, and send a value they share once."""
    shared = shared or {}

    def renamed(match: re.Match[str]) -> str:
        if match[1]:
            return match[1]
        return ":" + shared.get(match[2], prefix + match[2])

    return _LITERAL_OR_PLACEHOLDER.sub(renamed, sql)


def numbered(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of `values_list`: each row's values under `name_i`."""
    return {
        f"{name}_{row}": value for row, values in enumerate(rows) for name, value in values.items()
    }


def psycopg_value(value: Any) -> Any:
    if isinstance(value, JsonValue):
        return Json(value.value)
    if isinstance(value, datetime) and value.tzinfo is None:
        # psycopg would read it in the connection's time zone: refused, as the ORM's column
        # type refuses it.
        raise StorageError("naive datetime given for a UTC timestamp")
    return value


def sqlite_value(value: Any) -> Any:
    if isinstance(value, JsonValue):
        return json.dumps(value.value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise StorageError("naive datetime given for a UTC timestamp")
        return value.astimezone(UTC).strftime(_SQLITE_DATETIME)
    return value


def utc(value: datetime | str) -> datetime:
    """A timestamp column's value as the driver returned it, aware in UTC (SQLite returns
    the stored string, PostgreSQL an aware value in the connection's time zone)."""
    if isinstance(value, str):
        try:
            # The stored text is UTC without an offset: parsed with one, in 0.14 µs where
            # parsing and then `replace(tzinfo=UTC)` took 1 µs (a search reads ~700 rows).
            return datetime.fromisoformat(value + "+00:00")
        except ValueError:
            return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def converted(found: Sequence[Any], timestamps: Sequence[int]) -> list[tuple[Any, ...]]:
    if not timestamps:
        return [tuple(row) for row in found]
    if len(timestamps) == 1:
        # The recall search's rows (one timestamp each): built in one go.
        (at,) = timestamps
        return [
            (*row[:at], None if row[at] is None else utc(row[at]), *row[at + 1 :]) for row in found
        ]
    converted: list[tuple[Any, ...]] = []
    for row in found:
        values = list(row)
        for position in timestamps:
            if values[position] is not None:
                values[position] = utc(values[position])
        converted.append(tuple(values))
    return converted
