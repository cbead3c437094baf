"""Routing by reads alone (`find_unchanged`): the route of a message that continues a session
as it stands, and nothing changed or returned when routing has to change something; the
sessions it runs in (`Database.lookups`): no transaction on PostgreSQL, no lock on SQLite;
and the same answer from the user's current sessions read beforehand (`route_current`)."""

from __future__ import annotations

import asyncio
import dataclasses
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
    route_current,
)
from storage.database import Database
from storage.models import SessionStatus
from storage.repositories.session_state import (
    CURRENT_SESSIONS_READ,
    CurrentSessions,
    read_current_sessions,
)
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


async def current_of(database: Database, user_id: str) -> CurrentSessions:
    async with database.statement(writes=False) as scope:
        return await (await read_current_sessions(scope, user_id)).value()


async def routed_both_ways(
    database: Database, arrival: Arrival, policy: RoutingPolicy, now: datetime
) -> tuple[Route | Unrouted | None, Route | Unrouted]:
    """`route_current`'s answer from the current sessions read now, and `find_unchanged`'s."""
    current = await current_of(database, arrival.user_id)
    async with database.lookups() as db:
        read = await find_unchanged(db, arrival, policy, now=now)
    return route_current(arrival, policy, current, now=now), read


async def test_the_current_sessions_route_as_the_reads_do(database: Database) -> None:
    bob = Arrival(user_id="bob", org_id="acme", channel_type="slack", channel_id="D2")
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("bob", "acme", "Bob")
    assert await routed_both_ways(database, bob, POLICY, AT) == (Unrouted(fresh=True),) * 2
    session_id = await alice_with_a_session(database)
    for now in (AT + timedelta(hours=1), AT + timedelta(hours=9)):  # current, then idle
        ahead, read = await routed_both_ways(database, DM, POLICY, now)
        assert ahead == read
    assert isinstance(read, Unrouted)
    assert not read.fresh
    current = await current_of(database, "alice")
    assert current.complete
    assert current.latest[None].id == session_id
    assert current.latest[None].others_indexed is False

    # With a session per channel type, each channel finds its own, and one with none is new.
    by_channel = RoutingPolicy(scope="channel", archive_after=POLICY.archive_after)
    async with database.session() as db:
        for channel in ("slack", "web"):
            await SessionRepository(db).create("alice", "acme", scope_channel=channel, at=AT)
    for channel in ("slack", "web", "teams"):
        arrival = Arrival(user_id="alice", org_id="acme", channel_type=channel, channel_id="C")
        ahead, read = await routed_both_ways(database, arrival, by_channel, AT)
        assert ahead == read
        assert isinstance(read, Unrouted) == (channel == "teams")
        if isinstance(read, Route):
            assert read.session.id != session_id


async def test_threads_replies_and_scopes_not_read_are_left_to_the_reads(
    database: Database,
) -> None:
    await alice_with_a_session(database)
    current = await current_of(database, "alice")
    in_thread = Arrival(
        user_id="alice", org_id="acme", channel_type="slack", channel_id="D1", thread_id="T1"
    )
    answering = Arrival(
        user_id="alice", org_id="acme", channel_type="email", channel_id="a", references=("m",)
    )
    for arrival in (in_thread, answering):
        assert route_current(arrival, POLICY, current, now=AT) is None
    # More active sessions than one read returns (left by earlier scopes): a scope absent
    # from them is not known to have none.
    async with database.session() as db:
        for minutes in range(CURRENT_SESSIONS_READ):
            at = AT + timedelta(minutes=minutes)
            await SessionRepository(db).create("alice", "acme", scope_channel="web", at=at)
    current = await current_of(database, "alice")
    assert not current.complete
    slack = Arrival(user_id="alice", org_id="acme", channel_type="slack", channel_id="D1")
    by_channel = RoutingPolicy(scope="channel", archive_after=POLICY.archive_after)
    assert route_current(slack, by_channel, current, now=AT) is None
    web = dataclasses.replace(slack, channel_type="web")
    ahead, read = await routed_both_ways(database, web, by_channel, AT + timedelta(hours=1))
    assert ahead == read
    assert isinstance(read, Route)
