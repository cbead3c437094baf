"""The inbox: messages arriving together are committed together, each caller returns only after
its own row is committed, duplicates are recognised as before, and a failed batch fails every
caller in it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import structlog
from sqlalchemy import select
from structlog.testing import capture_logs

import gateway.inbox
from channels.base import ChannelMessage, ChannelType
from errors import StorageError
from gateway.inbox import Inbox
from gateway.metrics import GatewayMetrics
from storage import driver_rows
from storage.database import Database
from storage.driver_rows import DriverScope
from storage.inbox_signal import WorkerShare, inbox_listener
from storage.models import InboundEvent
from storage.repositories.inbox import NewInboundEvent
from tests.storage.listening import running, until

T0 = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def message(message_id: str, user: str = "U1", text: str = "hello") -> ChannelMessage:
    return ChannelMessage(
        channel_type=ChannelType.SLACK,
        channel_id="D1",
        message_id=message_id,
        user_identifier=f"T1:{user}",
        content=text,
        timestamp=T0,
        raw={"event_id": message_id},
    )


class Woken:
    """The dispatcher's side of `on_accept`: which senders were announced, in order."""

    def __init__(self) -> None:
        self.senders: list[str] = []

    def __call__(self, sender: str) -> None:
        self.senders.append(sender)


def inbox_for(database: Database, woken: Woken | None = None) -> Inbox:
    return Inbox(database, GatewayMetrics(), clock=lambda: T0, on_accept=woken or Woken())


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The inbox's log lines during the test."""
    with capture_logs() as entries:
        # A fresh logger: the module's own may have been bound (and cached) by an earlier
        # test's logging set-up, which capturing cannot reach any more.
        monkeypatch.setattr(gateway.inbox, "log", structlog.get_logger("gateway.inbox"))
        yield entries


@contextmanager
def counted_commits() -> Iterator[list[int]]:
    """Counts the inbox's INSERT statements while the block runs, each with the number of
    messages in it: one statement is one transaction (it commits by itself on PostgreSQL, in
    a session of its own on SQLite)."""
    commits: list[int] = []
    original = gateway.inbox.accept_events

    async def counted(
        scope: DriverScope, events: Sequence[NewInboundEvent], *, announce: bool = False
    ) -> list[int | None]:
        commits.append(len(events))
        return await original(scope, events, announce=announce)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gateway.inbox, "accept_events", counted)
        yield commits


async def stored_events(database: Database) -> list[InboundEvent]:
    async with database.session() as db:
        return list((await db.execute(select(InboundEvent).order_by(InboundEvent.id))).scalars())


async def test_messages_arriving_together_are_committed_in_one_transaction_in_order(
    database: Database,
) -> None:
    woken = Woken()
    inbox = inbox_for(database, woken)

    with counted_commits() as commits:
        results = await asyncio.gather(
            *(inbox.accept(message(f"m-{n:02}", user=f"U{n % 8}")) for n in range(64))
        )

    assert commits == [64]  # one transaction per message without group commit: 64
    assert all(result.accepted for result in results)
    assert [result.message_id for result in results] == [f"m-{n:02}" for n in range(64)]
    events = await stored_events(database)
    # Ids are queue order: arrival order is kept inside a batch.
    assert [stored.message_id for stored in events] == [f"m-{n:02}" for n in range(64)]
    assert {stored.status for stored in events} == {"pending"}
    assert events[5].sender_key == "slack:T1:U5"
    assert events[5].raw_payload == {"event_id": "m-05"}
    assert events[5].message["content"] == "hello"
    assert woken.senders == [f"slack:T1:U{n % 8}" for n in range(64)]
    metrics = inbox.metrics.render().decode()
    assert 'gateway_messages_in_total{channel="slack"} 64.0' in metrics


async def test_a_lone_message_is_committed_before_accept_returns(database: Database) -> None:
    inbox = inbox_for(database)

    with counted_commits() as commits:
        result = await inbox.accept(message("m-1"))
        # No waiting for company: the row is there the moment accept returns.
        assert [stored.message_id for stored in await stored_events(database)] == ["m-1"]

    assert result.accepted
    assert commits == [1]


async def test_what_arrives_while_a_batch_commits_goes_in_the_next_one(
    database: Database,
) -> None:
    inbox = inbox_for(database)
    first = asyncio.create_task(inbox.accept(message("m-first")))
    await asyncio.sleep(0)  # the first batch starts with one message

    with counted_commits() as commits:
        later = await asyncio.gather(*(inbox.accept(message(f"m-{n}")) for n in range(10)))
        assert (await first).accepted

    assert all(result.accepted for result in later)
    # The first batch's one message (its statement sent before or after the block began),
    # then the ten that arrived while it ran, together.
    assert commits in ([1, 10], [10])
    assert len(await stored_events(database)) == 11


async def test_duplicates_in_a_batch_and_in_the_table_are_dropped_and_logged(
    database: Database, logged: list[dict[str, Any]]
) -> None:
    woken = Woken()
    inbox = inbox_for(database, woken)
    assert (await inbox.accept(message("m-seen", user="U1"))).accepted

    logged.clear()
    results = await asyncio.gather(
        inbox.accept(message("m-seen", user="U1")),  # a retry of a committed message
        inbox.accept(message("m-new", user="U2")),
        inbox.accept(message("m-new", user="U2")),  # two deliveries at once
        inbox.accept(message("m-other", user="U3")),
    )

    assert [result.accepted for result in results] == [False, True, False, True]
    dropped = [
        entry["message_id"] for entry in logged if entry["event"] == "inbox.duplicate_dropped"
    ]
    assert sorted(dropped) == ["m-new", "m-seen"]
    assert [stored.message_id for stored in await stored_events(database)] == [
        "m-seen",
        "m-new",
        "m-other",
    ]
    assert woken.senders == ["slack:T1:U1", "slack:T1:U2", "slack:T1:U3"]
    metrics = inbox.metrics.render().decode()
    assert 'gateway_duplicates_dropped_total{channel="slack"} 2.0' in metrics
    assert 'gateway_messages_in_total{channel="slack"} 3.0' in metrics


async def test_a_failed_batch_fails_every_caller_and_stores_nothing(
    database: Database, logged: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    woken = Woken()
    inbox = inbox_for(database, woken)
    run_statement = driver_rows.rows

    async def lost_connection(session: Any, sql: str, *args: Any, **kwargs: Any) -> Any:
        # The inbox's INSERT runs through the driver: its error, as `driver_rows` raises it.
        if sql.startswith("INSERT INTO inbound_events"):
            lost = psycopg.OperationalError("server closed the connection unexpectedly")
            raise StorageError("database error: server closed the connection") from lost
        return await run_statement(session, sql, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(driver_rows, "rows", lost_connection)
        results = await asyncio.gather(
            *(inbox.accept(message(f"m-{n}")) for n in range(5)), return_exceptions=True
        )

    assert all(isinstance(result, StorageError) for result in results), results
    failed = [entry["message_id"] for entry in logged if entry["event"] == "inbox.accept_failed"]
    assert sorted(failed) == [f"m-{n}" for n in range(5)]
    assert await stored_events(database) == []
    assert woken.senders == []
    # The platforms retry, and the retries are taken as new messages.
    retried = await asyncio.gather(*(inbox.accept(message(f"m-{n}")) for n in range(5)))
    assert all(result.accepted for result in retried)


@pytest.mark.parametrize("database", ["postgres"], indirect=True)
async def test_a_message_the_database_refuses_fails_alone(database: Database) -> None:
    inbox = inbox_for(database)
    too_long = "x" * 600  # message_id is VARCHAR(512): PostgreSQL refuses the whole statement

    results = await asyncio.gather(
        inbox.accept(message("m-1")),
        inbox.accept(message(too_long)),
        inbox.accept(message("m-2")),
        return_exceptions=True,
    )

    assert [type(result).__name__ for result in results] == [
        "AcceptResult",
        "StorageError",
        "AcceptResult",
    ]
    assert [stored.message_id for stored in await stored_events(database)] == ["m-1", "m-2"]


async def test_a_caller_cancelled_before_its_batch_started_stores_nothing(
    database: Database,
) -> None:
    inbox = inbox_for(database)
    first = asyncio.create_task(inbox.accept(message("m-1")))
    await asyncio.sleep(0)  # the first batch is running
    gone = asyncio.create_task(inbox.accept(message("m-gone")))
    await asyncio.sleep(0)  # queued behind it
    gone.cancel()

    assert (await first).accepted
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert [stored.message_id for stored in await stored_events(database)] == ["m-1"]


async def test_only_postgresql_announces_new_messages_to_other_processes(
    database: Database,
) -> None:
    """Without an `on_accept` the turns run in other processes, told by PostgreSQL's
    notifications (what a turn worker's listener hears); on SQLite (one process) nobody
    would hear of the message."""
    if database.is_sqlite:
        with pytest.raises(ValueError, match="needs PostgreSQL"):
            Inbox(database, GatewayMetrics(), clock=lambda: T0, on_accept=None)
        return
    inbox = Inbox(database, GatewayMetrics(), clock=lambda: T0, on_accept=None)
    heard: list[str | None] = []
    async with running(inbox_listener(database.url, heard.append, WorkerShare(0, 1)), heard):
        assert (await inbox.accept(message("m-told", user="U7"))).accepted
        await until(lambda: len(heard) == 2)
    assert heard == [None, "slack:T1:U7"]
