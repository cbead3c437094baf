"""The look for a tool call waiting for a yes (`sessions.turn_tools.WaitingCalls`): skipped
only while the session's latest turn is the one this process answered and left none waiting;
a turn of another process (another `WaitingCalls`, on the same database) that asked for a yes
is seen, because every turn moves the session's `last_seq`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sessions.turn_tools import WaitingCalls
from storage.database import Database
from storage.repositories.sessions import SessionRepository
from storage.repositories.tool_confirmations import ToolConfirmationRepository, WaitingCall
from storage.repositories.users import OrganizationRepository, UserRepository
from storage.turn_store import MessageToStore, store_turn_messages
from tests.statements import recorded_statements

AT = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


async def session_with_a_turn(database: Database) -> tuple[str, int]:
    """Alice's session after one turn answered (a question and its answer): (id, last_seq)."""
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("alice", "acme", "Alice")
        session = await SessionRepository(db).create("alice", "acme", at=AT)
        first = await store_turn_messages(
            db,
            session.id,
            [
                MessageToStore("user", "web", "hello", 1),
                MessageToStore("assistant", "web", "hi", 1),
            ],
            at=AT,
        )
        return session.id, first + 1


async def another_process_asks(database: Database, session_id: str) -> int:
    """A turn answered elsewhere that asks for a yes; the session's new last_seq."""
    async with database.session() as db:
        first = await store_turn_messages(
            db,
            session_id,
            [
                MessageToStore("user", "web", "delete Wile E.", 1),
                MessageToStore("assistant", "web", "Run `crm__delete_contact`? Reply yes or no", 1),
            ],
            at=AT,
        )
        await ToolConfirmationRepository(db).ask(
            session_id,
            "alice",
            tool_name="crm__delete_contact",
            tool_input={"name": "Wile E."},
            question="Run `crm__delete_contact`? Reply yes or no",
            at=AT,
            expires_at=AT + timedelta(minutes=5),
        )
        return first + 1


async def test_a_call_asked_by_another_process_is_found_and_answered(database: Database) -> None:
    session_id, last_seq = await session_with_a_turn(database)
    here = WaitingCalls()
    here.remember(session_id, last_seq, none_waiting=True)
    # This process answered the latest turn and left nothing waiting: no look at all.
    with recorded_statements(database) as statements:
        async with database.lookups() as db:
            found = await here.read(db, session_id, last_seq, "alice", "yes", now=AT)
    assert found == (None, None)
    assert not [s for s in statements if "tool_confirmations" in s]

    moved = await another_process_asks(database, session_id)
    async with database.lookups() as db:
        waiting, confirmed = await here.read(db, session_id, moved, "alice", "yes", now=AT)
    assert waiting == WaitingCall(
        "alice",
        "crm__delete_contact",
        {"name": "Wile E."},
        "Run `crm__delete_contact`? Reply yes or no",
        AT + timedelta(minutes=5),
    )
    assert waiting.expires_at.tzinfo is not None
    assert confirmed is not None
    assert (confirmed.confirmed, confirmed.request.tool_input) == (True, {"name": "Wile E."})


async def test_a_turn_that_left_a_call_waiting_is_not_remembered_as_leaving_none(
    database: Database,
) -> None:
    session_id, last_seq = await session_with_a_turn(database)
    here = WaitingCalls()
    here.remember(session_id, last_seq, none_waiting=True)
    moved = await another_process_asks(database, session_id)
    # The same process answers the next turn, which leaves the call waiting (say, it was a
    # question about something else): the session's latest last_seq is not remembered.
    here.remember(session_id, moved, none_waiting=False)
    async with database.lookups() as db:
        waiting, _ = await here.read(db, session_id, moved, "alice", "what?", now=AT)
    assert waiting is not None
