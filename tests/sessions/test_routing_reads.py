"""Routing by reads alone (`find_unchanged`): the route of a message that continues a session
as it stands, and nothing changed or returned when routing has to change something; and the
sessions it runs in (`Database.lookups`): no transaction on PostgreSQL, no lock on SQLite."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from sessions.lifecycle import transition
from sessions.routing import (
    Arrival,
    Route,
    RoutingPolicy,
    Unrouted,
    find_unchanged,
    resolve_session,
)
from storage.database import Database
from storage.models import SessionStatus
from storage.repositories.sessions import SessionRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from tests.statements import recorded_statements

AT = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
POLICY = RoutingPolicy(scope="user", archive_after=timedelta(hours=8))
DM = Arrival(user_id="alice", org_id="acme", channel_type="slack", channel_id="D1")


async def alice_with_a_session(database: Database) -> str:
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("alice", "acme", "Alice")
        session = await SessionRepository(db).create("alice", "acme", at=AT)
        await SessionRepository(db).record_channel(session.id, "slack", "D1", "T1", at=AT)
        return session.id


def changed(db: AsyncSession) -> bool:
    """Whether the session holds changes to its objects that a flush would write."""
    return bool(db.new or db.dirty or db.deleted)


async def left_for_the_transaction(database: Database, arrival: Arrival, now: datetime) -> None:
    """Routing by reads finds a session to change, and changes nothing."""
    async with database.lookups() as db:
        assert await find_unchanged(db, arrival, POLICY, now=now) == Unrouted(fresh=False)
        assert not changed(db)


async def status_of(database: Database, session_id: str) -> str:
    async with database.session() as db:
        session = await SessionRepository(db).get(session_id)
        assert session is not None
        return session.status


async def test_a_message_continuing_its_session_is_routed_by_reads(database: Database) -> None:
    session_id = await alice_with_a_session(database)
    async with database.lookups() as db:
        route = await find_unchanged(db, DM, POLICY, now=AT + timedelta(hours=1))
        assert not changed(db)
    assert isinstance(route, Route)
    assert (route.session.id, route.reason, route.reactivated) == (session_id, "active", False)


async def test_a_first_message_is_left_to_the_transaction_that_only_creates(
    database: Database,
) -> None:
    await alice_with_a_session(database)
    bob = Arrival(user_id="bob", org_id="acme", channel_type="slack", channel_id="D2")
    async with database.session() as db:
        await UserRepository(db).upsert("bob", "acme", "Bob")
    async with database.lookups() as db:
        found = await find_unchanged(db, bob, POLICY, now=AT)
    assert found == Unrouted(fresh=True)
    assert isinstance(found, Unrouted)
    with recorded_statements(database) as statements:
        async with database.session() as db:
            route = await resolve_session(db, bob, POLICY, now=AT, unrouted=found)
    # Nothing looked up again: the session's INSERT is the transaction's one statement.
    assert [s.split()[0] for s in statements if not s.startswith("BEGIN")] == ["INSERT"]
    assert (route.reason, route.session.user_id) == ("new", "bob")


async def test_an_idle_session_is_left_for_the_transaction_to_archive(database: Database) -> None:
    session_id = await alice_with_a_session(database)
    later = AT + timedelta(hours=9)
    await left_for_the_transaction(database, DM, later)
    assert await status_of(database, session_id) == "active"
    async with database.session() as db:
        route = await resolve_session(db, DM, POLICY, now=later)
    assert (route.reason, route.session.id != session_id) == ("new", True)
    assert await status_of(database, session_id) == "archived"


async def test_an_archived_thread_is_left_for_the_transaction_to_reactivate(
    database: Database,
) -> None:
    session_id = await alice_with_a_session(database)
    async with database.session() as db:
        session = await SessionRepository(db).get(session_id)
        assert session is not None
        transition(session, SessionStatus.ARCHIVED, at=AT, reason="idle")
    in_thread = Arrival(
        user_id="alice", org_id="acme", channel_type="slack", channel_id="D1", thread_id="T1"
    )
    await left_for_the_transaction(database, in_thread, AT)
    assert await status_of(database, session_id) == "archived"
    async with database.session() as db:
        route = await resolve_session(db, in_thread, POLICY, now=AT)
    assert (route.session.id, route.reason, route.reactivated) == (session_id, "thread", True)


async def test_lookups_open_no_transaction_on_postgresql_and_take_no_lock_on_sqlite(
    database: Database,
) -> None:
    await alice_with_a_session(database)
    if database.is_sqlite:
        async with database.session() as writer:
            await OrganizationRepository(writer).upsert("globex", "Globex")
            # The writer holds SQLite's write lock; lookups read beside it, at once.
            async with asyncio.timeout(2), database.lookups() as db:
                names = (await db.execute(text("SELECT id FROM organizations"))).scalars()
                assert sorted(names) == ["acme"]
        return
    # A transaction's now() is its start; each statement of lookups is a transaction of its
    # own, so two statements apart in time see two different now()s.
    async with database.lookups() as db:
        first = await db.scalar(text("SELECT now()"))
        await asyncio.sleep(0.02)
        second = await db.scalar(text("SELECT now()"))
    assert first != second
    async with database.session() as db:
        first = await db.scalar(text("SELECT now()"))
        await asyncio.sleep(0.02)
        second = await db.scalar(text("SELECT now()"))
    assert first == second
