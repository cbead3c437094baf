"""The column types the tables are built from, read and written alike on SQLite and PostgreSQL.

`UTCDateTime` (every `datetime` column, through `storage.models.Base`'s type map) stores UTC
and reads back timezone-aware values, `utcnow` is its default; `BigIntId` is a 64-bit
autoincrementing id on both databases; `enum_column` stores a state enum as a plain string.
The tables themselves are in `storage.models`.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Dialect, Integer, String, TypeDecorator
from sqlalchemy.orm import Mapped, mapped_column

# SQLite has no 64-bit autoincrement type of its own; INTEGER PRIMARY KEY is its rowid.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC (the only kind of time the database holds)."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    SQLite drops the offset, PostgreSQL keeps it; this type makes both return aware UTC values
    and refuses naive ones on the way in, so no comparison ever mixes the two kinds.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Normalise to UTC; a naive datetime is a programming error."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Attach UTC to values SQLite returns without an offset."""
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def enum_column(enum_type: type[enum.StrEnum], default: enum.StrEnum) -> Mapped[Any]:
    """A column holding one of `enum_type`'s states, `default` when not given.

    Stored as plain strings: adding a state later needs no database enum migration.
    """
    length = max(len(member.value) for member in enum_type)
    return mapped_column(String(length), default=default.value, nullable=False)
