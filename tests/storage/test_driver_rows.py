"""Statements run through the driver itself (`storage.driver_rows`), on both backends."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest

from errors import StorageError
from storage.database import Database
from storage.driver_rows import _psycopg_sql, rows
from storage.models import Organization


def test_placeholders_become_psycopg_ones_and_casts_and_percents_stay() -> None:
    sql = "SELECT 'a%b', x::text, CAST(:ids AS bigint[]) WHERE y = :y_1 AND z ~ ':not'"
    assert _psycopg_sql(sql) == (
        "SELECT 'a%%b', x::text, CAST(%(ids)s AS bigint[]) WHERE y = %(y_1)s AND z ~ ':not'"
    )


async def test_rows_with_bound_times_and_timestamps_in_utc(database: Database) -> None:
    made = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
    async with database.session() as db:
        db.add(Organization(id="o1", name="One", context="", created_at=made))
        db.add(Organization(id="o2", name="Two", context="", created_at=made + timedelta(days=1)))
    # A bound time in another zone compares as the instant it is, as SQLAlchemy binds it.
    since = (made - timedelta(microseconds=1)).astimezone(timezone(timedelta(hours=-5)))
    async with database.reading() as db:
        found = await rows(
            db,
            "SELECT o.id, o.created_at, 'x%' FROM organizations o "
            "WHERE o.created_at > :since AND o.created_at < :until ORDER BY o.id",
            {"since": since, "until": made + timedelta(hours=1)},
            timestamps=(1,),
        )
    assert found == [("o1", made, "x%")]
    assert found[0][1].tzinfo is UTC


async def test_a_database_error_is_a_storage_error_and_the_session_goes_on(
    database: Database,
) -> None:
    async with database.reading() as db:
        with pytest.raises(StorageError, match="database error"):
            await rows(db, "SELECT no_such_column FROM organizations", {})
    # The connection went back to the pool in a usable state.
    async with database.reading() as db:
        assert await rows(db, "SELECT :one", {"one": 1}) == [(1,)]


async def test_a_naive_time_is_refused(database: Database) -> None:
    if not database.is_sqlite:
        pytest.skip("PostgreSQL's driver binds a naive time as a timestamp without a zone")
    async with database.reading() as db:
        with pytest.raises(ValueError, match="naive"):
            await rows(db, "SELECT :at", {"at": datetime(2026, 1, 1)})


async def test_a_connection_lost_meanwhile_fails_once_and_the_next_read_works(
    database: Database,
) -> None:
    if database.is_sqlite:
        pytest.skip("a SQLite connection is a file, not a server process")
    async with database.reading() as db:
        ((pid,),) = await rows(db, "SELECT pg_backend_pid()", {})
    # From a connection of its own (the pool would hand out the one to be ended).
    url = database.url.set(drivername="postgresql").render_as_string(hide_password=False)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        async with asyncio.timeout(10):
            while await (
                await admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
            ).fetchone():
                await asyncio.sleep(0.01)
    # The pooled connection whose server process is gone: its statement fails as a
    # StorageError, and the pool does not hand it out again.
    with pytest.raises(StorageError):
        async with database.reading() as db:
            await rows(db, "SELECT 1", {})
    async with database.reading() as db:
        ((other,),) = await rows(db, "SELECT pg_backend_pid()", {})
    assert other != pid
