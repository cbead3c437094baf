"""Statements run through the driver itself (`storage.driver_rows`), on both backends."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage import driver_rows
from storage.database import Database
from storage.driver_rows import JsonValue, json_value, numbered, pipelined, rows, send, values_list
from storage.driver_values import psycopg_sql
from storage.models import InboundEvent, Organization


def test_placeholders_become_psycopg_ones_and_casts_and_percents_stay() -> None:
    sql = "SELECT 'a%b', x::text, CAST(:ids AS bigint[]) WHERE y = :y_1 AND z ~ ':not'"
    assert psycopg_sql(sql) == (
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


def test_a_timestamps_text_or_value_reads_as_the_instant_in_utc() -> None:
    instant = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
    # SQLite's stored text (UTC, no offset), with and without its fraction; text that carries
    # an offset keeps its wall time, as before; a value in another zone is converted.
    assert driver_rows.utc("2026-03-04 05:06:07.890123") == instant
    assert driver_rows.utc("2026-03-04 05:06:07") == instant.replace(microsecond=0)
    assert driver_rows.utc("2026-03-04T05:06:07.890123+00:00") == instant
    assert driver_rows.utc(instant.astimezone(timezone(timedelta(hours=-5)))) == instant
    read = [driver_rows.utc(value) for value in ("2026-03-04 05:06:07", instant)]
    assert all(value.tzinfo is UTC for value in read)
    with pytest.raises(ValueError, match="Invalid isoformat"):
        driver_rows.utc("not a time")


async def test_many_rows_in_one_values_list(database: Database) -> None:
    made = datetime(2026, 3, 4, tzinfo=UTC)
    names = ("id", "name", "context", "created_at")
    organizations = [
        {"id": f"o{i}", "name": f"Org {i}", "context": "", "created_at": made} for i in range(3)
    ]
    async with database.session() as db:
        assert values_list(names, 2) == (
            "(:id_0, :name_0, :context_0, :created_at_0), (:id_1, :name_1, :context_1, "
            ":created_at_1)"
        )
        await rows(
            db,
            f"INSERT INTO organizations ({', '.join(names)}) VALUES {values_list(names, 3)}",
            numbered(organizations),
        )
    async with database.reading() as db:
        found = await rows(db, "SELECT id, name FROM organizations ORDER BY id", {})
    assert found == [("o0", "Org 0"), ("o1", "Org 1"), ("o2", "Org 2")]


async def test_json_written_and_read_as_sqlalchemy_does(database: Database) -> None:
    record = {"text": "héllo 100%", "files": [{"name": "a.pdf", "size": 3}], "none": None}
    async with database.session() as db:
        (written,) = await rows(
            db,
            "INSERT INTO inbound_events (channel_type, message_id, sender_key, status, "
            "attempts, received_at, message, raw_payload) VALUES ('web', 'm1', 'web:a', "
            "'pending', 0, :at, :message, :raw) RETURNING id",
            {"at": datetime.now(UTC), "message": JsonValue(record), "raw": JsonValue({})},
        )
    async with database.session() as db:
        event = await db.get(InboundEvent, written[0])
        assert event is not None
        assert event.message == record  # SQLAlchemy's JSON type reads what the driver wrote
        (read,) = await rows(db, "SELECT message, live_reply FROM inbound_events", {})
    assert json_value(read[0]) == record
    assert json_value(read[1]) is None


async def test_the_sessions_pending_changes_go_first(database: Database) -> None:
    async with database.session() as db:
        db.add(Organization(id="o1", name="One", context=""))
        # Not flushed yet: the driver's statement must still see it, as SQLAlchemy's own do.
        assert await rows(db, "SELECT name FROM organizations", {}) == [("One",)]


async def test_a_database_error_is_a_storage_error_and_the_session_goes_on(
    database: Database,
) -> None:
    async with database.reading() as db:
        with pytest.raises(StorageError, match="database error"):
            await rows(db, "SELECT no_such_column FROM organizations", {})
    # The connection went back to the pool in a usable state.
    async with database.reading() as db:
        assert await rows(db, "SELECT :one", {"one": 1}) == [(1,)]


INSERT_ORGANIZATION = (
    "INSERT INTO organizations (id, name, context, created_at) VALUES (:id, :id, '', :at)"
)


async def test_pipelined_statements_see_each_other_and_their_rows_come_later(
    database: Database,
) -> None:
    at = datetime(2026, 3, 4, tzinfo=UTC)
    async with database.session() as db, pipelined(db):
        first = await send(
            db,
            INSERT_ORGANIZATION + " RETURNING id, created_at",
            {"id": "o1", "at": at},
            timestamps=(1,),
        )
        second = await send(db, INSERT_ORGANIZATION, {"id": "o2", "at": at})
        # Waited for: it sends what is queued, and sees it.
        assert await rows(db, "SELECT count(*) FROM organizations", {}) == [(2,)]
        assert await first.rows() == [("o1", at)]
        assert await second.rows() == []
    async with database.reading() as db:
        assert await rows(db, "SELECT id FROM organizations ORDER BY id", {}) == [
            ("o1",),
            ("o2",),
        ]


def count_connection_asks(session: AsyncSession) -> list[None]:
    """A list that grows by one each time `session` is asked for its connection."""
    asked: list[None] = []
    real_connection = session.connection

    async def counted(*args: Any, **kwargs: Any) -> Any:
        asked.append(None)
        return await real_connection(*args, **kwargs)

    session.connection = counted  # type: ignore[method-assign]
    return asked


async def test_a_pipelined_block_asks_its_session_for_the_connection_once(
    database: Database,
) -> None:
    at = datetime(2026, 3, 4, tzinfo=UTC)
    async with database.session() as db:
        asked = count_connection_asks(db)
        async with pipelined(db):
            for org in ("o1", "o2", "o3"):
                await send(db, INSERT_ORGANIZATION, {"id": org, "at": at})
            found = await rows(db, "SELECT count(*) FROM organizations", {})

    # The block's own question only: asking for each statement cost 0.05 ms or more.
    assert asked == [None]
    assert found == [(3,)]


async def test_a_session_is_asked_for_its_connection_once_a_transaction(
    database: Database,
) -> None:
    async with database.sessionmaker() as db:  # its transactions begin as it needs them
        asked = count_connection_asks(db)
        for _ in range(3):
            assert await rows(db, "SELECT 1", {}) == [(1,)]
        assert len(asked) == 1
        await db.commit()  # a new transaction, perhaps on another connection: asked again
        assert await rows(db, "SELECT 2", {}) == [(2,)]
        assert len(asked) == 2
        # ORM changes waiting: flushed first, as autoflush does, and the session asked again.
        db.add(Organization(id="o9", name="Nine", context=""))
        assert await rows(db, "SELECT count(*) FROM organizations", {}) == [(1,)]
        assert len(asked) == 3


async def test_a_queued_statements_error_comes_at_the_next_wait_and_nothing_is_kept(
    database: Database,
) -> None:
    at = datetime(2026, 3, 4, tzinfo=UTC)
    async with database.session() as db:
        await send(db, INSERT_ORGANIZATION, {"id": "o1", "at": at})
    reached = []

    async def write_o2_and_o1_again() -> None:
        async with database.session() as db, pipelined(db):
            await send(db, INSERT_ORGANIZATION, {"id": "o2", "at": at})
            await send(db, INSERT_ORGANIZATION, {"id": "o1", "at": at})
            # PostgreSQL: queued, not answered yet; its error comes with the next wait. SQLite
            # has no pipeline: each statement runs as it is sent.
            reached.append("queued")
            await rows(db, "SELECT 1", {})

    with pytest.raises(StorageError, match="database error"):
        await write_o2_and_o1_again()
    assert reached == ([] if database.is_sqlite else ["queued"])
    async with database.reading() as db:
        assert await rows(db, "SELECT id FROM organizations", {}) == [("o1",)]


async def test_a_naive_time_is_refused(database: Database) -> None:
    # PostgreSQL's driver would bind it as a time without a zone, read in the connection's.
    async with database.reading() as db:
        with pytest.raises(StorageError, match="naive"):
            await rows(db, "SELECT :at", {"at": datetime(2026, 1, 1)})
        with pytest.raises(StorageError, match="naive"):
            await send(db, "SELECT :at", {"at": datetime(2026, 1, 1)})
        # Refused before anything was sent: the transaction goes on.
        assert await rows(db, "SELECT 1", {}) == [(1,)]


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


async def test_binary_rows_load_as_the_text_format_does(
    migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL sends rows in its binary format (`BINARY_RESULTS`): every type the
    statements read loads to the value the text format gives, as the same Python type."""
    database = Database(migrated_postgres_url)
    sql = (
        "SELECT 7::int, 2::int8 ^ 40, 0.25::float8, sum(x)::numeric, 'a ü'::text, "
        "'v'::varchar(3), true, TIMESTAMPTZ '2026-03-04 05:06:07.123456+02', "
        "decode('00ff10', 'hex'), '{\"a\": [1, 2.5]}'::json, '{\"b\": null}'::jsonb, "
        "ARRAY['x', 'y'], ARRAY[1, 2]::bigint[], NULL::text, count(*), "
        "set_config('application_name', 'g', true) "
        "FROM (VALUES (1), (2)) AS v(x)"
    )
    try:
        read: dict[bool, list[tuple[Any, ...]]] = {}
        for binary in (False, True):
            monkeypatch.setattr(driver_rows, "BINARY_RESULTS", binary)
            async with database.reading() as db:
                read[binary] = await rows(db, sql, {}, timestamps=(7,))
            async with database.statement(writes=False) as lent:
                assert await rows(lent, sql, {}, timestamps=(7,)) == read[binary]
        assert read[True] == read[False]
        assert [type(value) for value in read[True][0]] == [type(value) for value in read[False][0]]
        assert read[True][0][8] == b"\x00\xff\x10"
        assert read[True][0][9] == {"a": [1, 2.5]}
    finally:
        await database.dispose()
