"""A turn's write (`sessions.turn.TurnService.answer`): committed when its event was still
pending and its session's last number the one it read, nothing of it otherwise; on
PostgreSQL the statements check that themselves and commit together in one round trip."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import func, select, text, update

from errors import StorageError
from gateway.open_services import open_engine
from gateway.settings import GatewayConfig
from sessions.llm import OfflineLLM
from sessions.routing import Arrival, RoutingPolicy
from sessions.turn import TurnService
from sessions.turn_values import ReplyAddress, TurnSupersededError, UserTurn
from storage import driver_rows
from storage.database import Database
from storage.local_transcripts import LocalTranscriptStore
from storage.models import InboundEvent, OutboundMessage, Session, SessionMessage
from storage.repositories.inbox import InboxRepository
from storage.repositories.users import OrganizationRepository, UserRepository

AT = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
ALICE = Arrival(user_id="alice", org_id="acme", channel_type="web", channel_id="alice")


def service(database: Database, tmp_path: Path) -> TurnService:
    transcripts = LocalTranscriptStore(tmp_path / "transcripts")
    engine = open_engine(GatewayConfig(), database, transcripts, OfflineLLM(), lambda: AT)
    return TurnService(
        database,
        engine,
        transcripts,
        RoutingPolicy("user", timedelta(hours=8)),
        clock=lambda: AT,
        reply_lease=timedelta(minutes=1),
    )


async def event(database: Database, message_id: str) -> int:
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("alice", "acme", "Alice")
        event_id = await InboxRepository(db).accept(
            "web",
            message_id,
            sender_key="web:alice",
            message={"content": message_id},
            raw_payload={},
            at=AT,
        )
    assert event_id is not None
    return event_id


def turn(event_id: int, message_id: str) -> UserTurn:
    return UserTurn(
        event_id=event_id,
        arrival=ALICE,
        message_id=message_id,
        text=f"question {message_id}",
        reply_to=ReplyAddress("web", "alice"),
    )


def while_answering(
    turns: TurnService, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], Awaitable[None]]
) -> None:
    """Run `meanwhile` while the turn's model answers (before the turn writes)."""
    reply = turns.engine.reply

    async def replying(*args: Any, **kwargs: Any) -> Any:
        await meanwhile()
        return await reply(*args, **kwargs)

    monkeypatch.setattr(turns.engine, "reply", replying)


async def counts(database: Database) -> tuple[int, int, int]:
    """Messages stored, replies queued, the sessions' messages counted."""
    async with database.session() as db:
        messages = await db.scalar(select(func.count()).select_from(SessionMessage))
        replies = await db.scalar(select(func.count()).select_from(OutboundMessage))
        counted = await db.scalar(select(func.coalesce(func.sum(Session.message_count), 0)))
    return int(messages or 0), int(replies or 0), int(counted or 0)


async def test_a_turn_is_written_with_its_reply_and_its_event_finished(
    database: Database, tmp_path: Path
) -> None:
    turns = service(database, tmp_path)
    event_id = await event(database, "m1")
    result = await turns.answer(turn(event_id, "m1"))
    assert (result.first_seq, result.last_seq) == (1, 2)
    assert result.outbound is not None
    assert result.outbound.id > 0
    assert await counts(database) == (2, 1, 2)
    async with database.session() as db:
        finished = await db.get(InboundEvent, event_id)
        assert finished is not None
        assert (finished.status, finished.appended_seq) == ("done", 1)


@pytest.mark.parametrize("refusal", ["at the commit", "at the next statement"])
async def test_a_turn_whose_event_was_answered_elsewhere_writes_nothing(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: str
) -> None:
    turns = service(database, tmp_path)
    if refusal == "at the next statement":
        # The finish's refusal arrives before the reply's INSERT is sent, which raises it.
        send = driver_rows.send

        async def slowly(db: Any, sql: str, params: Any, **kwargs: Any) -> Any:
            sent = await send(db, sql, params, **kwargs)
            if "UPDATE inbound_events" in sql:
                await asyncio.sleep(0.2)
            return sent

        monkeypatch.setattr(driver_rows, "send", slowly)
    await turns.answer(turn(await event(database, "m1"), "m1"))
    event_id = await event(database, "m2")

    async def answered_meanwhile() -> None:
        # Another process finished the event while this turn's model was answering.
        async with database.session() as other:
            await other.execute(
                update(InboundEvent).where(InboundEvent.id == event_id).values(status="done")
            )

    while_answering(turns, monkeypatch, answered_meanwhile)
    with pytest.raises(TurnSupersededError, match="answered elsewhere"):
        await turns.answer(turn(event_id, "m2"))
    monkeypatch.undo()
    assert await counts(database) == (2, 1, 2)  # the first turn's, nothing of the second


async def test_a_turn_whose_session_moved_on_writes_nothing(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = service(database, tmp_path)
    first = await turns.answer(turn(await event(database, "m1"), "m1"))
    event_id = await event(database, "m2")

    async def moved_meanwhile() -> None:
        # The session's last number moved while the model was answering (it never does under
        # the user's turn lock; the write must still refuse it).
        async with database.session() as other:
            await other.execute(
                update(Session)
                .where(Session.id == first.session_id)
                .values(last_seq=Session.last_seq + 5)
            )

    while_answering(turns, monkeypatch, moved_meanwhile)
    with pytest.raises(StorageError, match="moved on"):
        await turns.answer(turn(event_id, "m2"))
    monkeypatch.undo()
    assert await counts(database) == (2, 1, 2)
    async with database.session() as db:
        pending = await db.get(InboundEvent, event_id)
        assert pending is not None
        assert pending.status == "pending"


async def test_on_postgresql_the_write_is_one_transaction_with_no_begin_or_commit(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if database.is_sqlite:
        pytest.skip("SQLite checks the answers before its session commits")
    turns = service(database, tmp_path)
    # Every commit psycopg is asked for with a transaction open, and whether in a pipeline.
    commits: list[bool] = []
    commit = psycopg.AsyncConnection.commit

    async def recorded(connection: psycopg.AsyncConnection[Any]) -> None:
        if connection.pgconn.transaction_status != TransactionStatus.IDLE:
            commits.append(connection._pipeline is not None)
        await commit(connection)

    monkeypatch.setattr(psycopg.AsyncConnection, "commit", recorded)
    event_id = await event(database, "m1")
    answered = await turns.answer(turn(event_id, "m1"))
    # The write sent no COMMIT (a session's transaction before it, routing the message to a
    # new session, did): its statements were one implicit transaction, ended by the Sync.
    assert True not in commits
    assert await counts(database) == (2, 1, 2)
    # One transaction wrote the messages, their vectors, the event's finish, the reply and
    # the session's counters: every row carries its id.
    async with database.session() as db:
        written = [
            (await db.execute(text(f"SELECT DISTINCT xmin::text FROM {table} WHERE {where}")))
            .scalars()
            .all()
            for table, where in (
                ("session_messages", "true"),
                ("recall_vectors", "true"),
                ("outbound_messages", "true"),
                ("inbound_events", f"id = {event_id}"),
                ("sessions", f"id = '{answered.session_id}'"),
            )
        ]
    assert all(len(ids) == 1 for ids in written), written
    assert len({ids[0] for ids in written}) == 1, written


async def test_a_requirement_aborts_the_transaction(database: Database) -> None:
    if database.is_sqlite:
        pytest.skip("the requirement function is PostgreSQL's (migration 0009)")

    async def insert_then_require_nothing() -> None:
        async with database.session() as db:
            await driver_rows.rows(
                db,
                "INSERT INTO organizations (id, name, context, created_at) "
                "VALUES ('o1', 'O', '', :at)",
                {"at": AT},
            )
            await driver_rows.rows(
                db,
                "WITH none AS (SELECT 1 AS id WHERE false) SELECT max(id) FROM none HAVING "
                + driver_rows.required("nothing's there"),
                {},
            )

    with pytest.raises(driver_rows.RequirementError) as failed:
        await insert_then_require_nothing()
    assert failed.value.reason == "nothing's there"
    async with database.session() as db:
        assert await driver_rows.rows(db, "SELECT id FROM organizations", {}) == []
