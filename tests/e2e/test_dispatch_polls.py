"""The dispatcher's poll of the whole inbox beside the drains it runs: no second read of a
queue that a running drain is answering, and nothing lost when a message's hint is."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from gateway import dispatcher
from gateway.dispatcher import QueueRead
from sessions import routing
from storage.database import Database
from storage.driver_rows import DriverScope, LentConnection
from storage.locks import FirstRead, Held, PostgresTurnLocks
from storage.repositories.inbox import UserQueueRead
from storage.repositories.session_state import SessionState
from storage.repositories.sessions import SessionRepository
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway


def count_queue_reads(monkeypatch: pytest.MonkeyPatch) -> list[Sequence[str]]:
    """Every read of a user's queue from now on (the identities it was read for)."""
    reads: list[Sequence[str]] = []
    original = dispatcher.send_user_queue

    async def counted(
        scope: DriverScope, sender_keys: Sequence[str], *, limit: int = 1
    ) -> UserQueueRead:
        reads.append(tuple(sender_keys))
        return await original(scope, sender_keys, limit=limit)

    monkeypatch.setattr(dispatcher, "send_user_queue", counted)
    return reads


@contextlib.asynccontextmanager
async def answering_alice(tmp_path: Path, message_id: str) -> AsyncIterator[RunningGateway]:
    """A gateway whose model takes 400 ms, answering a message of Alice's."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
    config = gateway_config(url, tmp_path, llm={"offline_latency": "400ms"})
    async with running_gateway(config) as gateway:
        await gateway.post("alice", "hello", message_id=message_id)
        for _ in range(200):
            if gateway.runtime.dispatcher.is_draining("alice"):
                yield gateway
                return
            await asyncio.sleep(0.01)
        raise AssertionError("Alice's turn never started")


async def test_polls_during_a_turn_do_not_read_its_queue_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = count_queue_reads(monkeypatch)
    async with answering_alice(tmp_path, "p1") as gateway:
        for _ in range(3):  # the event is pending all the while its turn runs
            await gateway.runtime.dispatcher.schedule()
            await asyncio.sleep(0.05)
        await gateway.wait_for_replies("alice", 1)
        await gateway.wait_for_turns_to_end("alice")
    assert len(reads) == 1


async def test_a_message_whose_hint_was_lost_is_answered_after_the_running_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with answering_alice(tmp_path, "h1") as gateway:
        dispatcher = gateway.runtime.dispatcher
        # As if the second message's notification never arrived (another process accepted
        # it and its database notification was lost): only the poll can find it.
        monkeypatch.setattr(dispatcher, "notify", lambda sender_key=None: None)
        await gateway.post("alice", "second", message_id="h2")
        replies = await gateway.wait_for_replies("alice", 2, timeout=10)
    assert [reply["in_reply_to"] for reply in replies] == ["h1", "h2"]


async def test_turns_route_by_the_sessions_read_with_their_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher reads the user's current sessions with the queue: a message with no
    thread is routed by them, its turn reads no session of its own; one in a thread is not."""
    looked_up: list[str] = []
    original = routing.latest_active

    async def counted(
        scope: DriverScope, user_id: str, *, scope_channel: str | None = None
    ) -> SessionState | None:
        looked_up.append(user_id)
        return await original(scope, user_id, scope_channel=scope_channel)

    monkeypatch.setattr(routing, "latest_active", counted)
    url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
    async with running_gateway(gateway_config(url, tmp_path)) as gateway:
        for number in range(3):
            await gateway.post("alice", f"message {number}", message_id=f"m{number}")
            await gateway.wait_for_replies("alice", number + 1)
        await gateway.wait_for_turns_to_end("alice")
        assert looked_up == []
        await gateway.post("alice", "in a thread", message_id="m3", thread_id="t1")
        await gateway.wait_for_replies("alice", 4)
        await gateway.wait_for_turns_to_end("alice")
        assert looked_up == ["alice"]
        async with gateway.runtime.database.session() as db:
            sessions = await SessionRepository(db).list_for_user("alice")
    assert [session.message_count for session in sessions] == [8]


async def test_a_drain_reads_its_first_batch_with_its_turn_lock(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the first read of a drain goes on the lock connection, in the round trip
    that takes the user's lock (no connection or transaction of its own); on SQLite the
    drain reads it. Either way each message is answered once. A message's drain reads its
    queue once, and a drain may run once more when the dispatcher's poll of the whole inbox
    and the message's hint both start it (a second look at the queue, not a second answer):
    on a busy machine the poll, once a second, can meet a message."""
    read_on: list[int | None] = []  # each read's server process (None: not a lent connection)
    original = dispatcher.send_queue_read

    async def recorded(scope: DriverScope, user_id: str, keys: Sequence[str]) -> QueueRead:
        read_on.append(scope.raw.info.backend_pid if isinstance(scope, LentConnection) else None)
        return await original(scope, user_id, keys)

    monkeypatch.setattr(dispatcher, "send_queue_read", recorded)
    async with running_gateway(gateway_config(database_url, tmp_path)) as gateway:
        for number in range(3):
            await gateway.post("alice", f"message {number}", message_id=f"m{number}")
            await gateway.wait_for_replies("alice", number + 1)
            await gateway.wait_for_turns_to_end("alice")
        locks = gateway.runtime.locks
        if isinstance(locks, PostgresTurnLocks):
            assert locks._connection is not None
            lock_connection = (await locks._connection.get_raw_connection()).driver_connection
            expected = lock_connection.info.backend_pid
        else:
            expected = None
        assert len(read_on) >= 3
        assert set(read_on) == {expected}, read_on


async def test_a_lock_held_by_another_process_is_taken_next_without_the_read(
    tmp_path: Path, migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When another process held a user's lock, the next take goes without the queue's read
    (it would likely be sent for nothing); once taken, the reads go with the takes again."""
    other = PostgresTurnLocks(Database(migrated_postgres_url))
    async with running_gateway(gateway_config(migrated_postgres_url, tmp_path)) as gateway:
        locks = gateway.runtime.locks
        assert isinstance(locks, PostgresTurnLocks)
        takes: list[str] = []
        hold, hold_reading = locks.hold, locks.hold_reading

        def plain(key: str) -> contextlib.AbstractAsyncContextManager[bool]:
            takes.append("plain")
            return hold(key)

        def reading(
            key: str, first: FirstRead[QueueRead]
        ) -> contextlib.AbstractAsyncContextManager[Held[QueueRead]]:
            takes.append("reading")
            return hold_reading(key, first)

        monkeypatch.setattr(locks, "hold", plain)
        monkeypatch.setattr(locks, "hold_reading", reading)
        async with other.hold("user:alice") as held_elsewhere:
            assert held_elsewhere
            await gateway.post("alice", "while another process answers her", message_id="c1")
            for _ in range(200):
                if takes:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
        assert takes[0] == "reading"
        assert set(takes[1:]) <= {"plain"}  # polls while the other process held it
        taken_at = len(takes)
        await gateway.runtime.dispatcher.schedule()  # as the next poll would
        await gateway.wait_for_replies("alice", 1)
        await gateway.wait_for_turns_to_end("alice")
        assert takes[taken_at:] == ["plain"]
        await gateway.post("alice", "and now", message_id="c2")
        await gateway.wait_for_replies("alice", 2)
        await gateway.wait_for_turns_to_end("alice")
        assert takes[taken_at:] == ["plain", "reading"]
    await other.close()
    await other.database.dispose()
