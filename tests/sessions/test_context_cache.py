"""The context caches: a session's history is read once, extended by the turn's own writes,
and checked against the session row, so writes it did not see (another process's turns, a
compaction) are never missed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event

from sessions import context_cache
from sessions.compaction import as_history
from sessions.context import HistoryMessage
from sessions.context_cache import HistoryCache, MemoryCache
from sessions.memory import RetentionPolicy
from storage.database import Database
from storage.models import SessionCompaction
from storage.repositories.compactions import CompactionRepository
from storage.repositories.memory import MemoryRepository
from storage.repositories.sessions import SessionRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from storage.turn_store import MessageToStore, store_turn_messages

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


async def new_session(database: Database) -> str:
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("alice", "acme", "Alice")
        return (await SessionRepository(db).create("alice", "acme", at=T0)).id


async def store(database: Database, session_id: str, *texts: str) -> int:
    """Messages written as another process would: straight to the database."""
    async with database.session() as db:
        return await store_turn_messages(
            db,
            session_id,
            [MessageToStore("user", "web", text, tokens=1) for text in texts],
            at=T0,
        )


async def cached_texts(cache: HistoryCache, database: Database, session_id: str) -> list[str]:
    async with database.session() as db:
        session = await SessionRepository(db).get(session_id)
        assert session is not None
        history = await cache.read(db, session)
    return [message.content for message in history.messages]


async def test_messages_written_elsewhere_are_read_once_the_row_shows_them(
    database: Database,
) -> None:
    session_id = await new_session(database)
    cache = HistoryCache()
    await store(database, session_id, "one", "two")
    assert await cached_texts(cache, database, session_id) == ["one", "two"]
    await store(database, session_id, "three")
    assert await cached_texts(cache, database, session_id) == ["one", "two", "three"]


async def test_the_history_read_is_the_stored_messages_field_for_field(database: Database) -> None:
    session_id = await new_session(database)
    blocks = [{"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "x"}}]
    async with database.session() as db:
        await store_turn_messages(
            db,
            session_id,
            [
                MessageToStore("user", "slack", "in a thread", tokens=3, thread_id="T.1"),
                MessageToStore("assistant", "slack", "", tokens=9, metadata={"blocks": blocks}),
            ],
            at=T0,
        )
    cache = HistoryCache()
    async with database.session() as db:
        session = await SessionRepository(db).get(session_id)
        assert session is not None
        read = (await cache.read(db, session)).messages
        stored = as_history(await SessionRepository(db).messages(session_id))
    assert list(read) == stored
    assert (read[0].thread_id, read[1].blocks, read[1].tokens) == ("T.1", tuple(blocks), 9)


async def test_a_turns_own_messages_extend_the_cache_without_a_read(database: Database) -> None:
    session_id = await new_session(database)
    cache = HistoryCache()
    await store(database, session_id, "one")
    await cached_texts(cache, database, session_id)
    first = await store(database, session_id, "two")
    cache.extend(
        session_id, after_seq=first - 1, messages=[HistoryMessage(first, "user", "two (cached)")]
    )
    # The row says seq 2 and the cache is at 2: its own copy is used, nothing is read again.
    assert await cached_texts(cache, database, session_id) == ["one", "two (cached)"]


async def test_a_compaction_makes_the_cache_read_the_window_again(database: Database) -> None:
    session_id = await new_session(database)
    cache = HistoryCache()
    await store(database, session_id, "one", "two", "three")
    await cached_texts(cache, database, session_id)
    async with database.session() as db:
        await CompactionRepository(db).add(
            SessionCompaction(
                session_id=session_id,
                seq=1,
                first_message_seq=1,
                last_message_seq=2,
                messages_compacted=2,
                tokens_before=3,
                tokens_after=1,
                archive_ref="archive",
                summary="one and two",
            )
        )
        session = await SessionRepository(db).get(session_id)
        assert session is not None
        session.compaction_count = 1
    async with database.session() as db:
        session = await SessionRepository(db).get(session_id)
        assert session is not None
        history = await cache.read(db, session)
    assert (history.summary, [m.content for m in history.messages]) == ("one and two", ["three"])


async def test_a_session_with_no_message_yet_is_not_read_and_then_grows_as_usual(
    database: Database,
) -> None:
    session_id = await new_session(database)
    cache = HistoryCache()
    statements: list[str] = []
    listen = event.listens_for(database.engine.sync_engine, "before_cursor_execute")

    @listen
    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    async with database.session() as db:
        session = await SessionRepository(db).get(session_id)
        assert session is not None
        statements.clear()
        history = await cache.read(db, session)
    assert (history.messages, history.summary, statements) == ((), None, [])
    await store(database, session_id, "one")
    assert await cached_texts(cache, database, session_id) == ["one"]


async def test_a_memory_read_that_a_change_overtook_is_used_once_and_not_kept(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("alice", "acme", "Alice")

    async def remember(fact_key: str, fact: str) -> None:
        async with database.session() as db:
            await MemoryRepository(db).remember(
                "alice",
                fact_key=fact_key,
                fact=fact,
                category="fact",
                source_session_id=None,
                at=T0,
            )

    async def facts() -> tuple[str, ...]:
        async with database.session() as db:
            found, _ = await cache.read(db, "alice", T0)
        return found

    cache = MemoryCache(50, 3, RetentionPolicy(), ttl=600)
    await remember("team", "Alice works in sales.")
    send = context_cache.send_fact_texts

    async def overtaken(db: Any, user_id: str, **kwargs: Any) -> Any:
        sent = await send(db, user_id, **kwargs)
        cache.changed(user_id)  # a change announced while the read is out
        return sent

    with monkeypatch.context() as patched:
        patched.setattr(context_cache, "send_fact_texts", overtaken)
        assert await facts() == ("Alice works in sales.",)
    # Not kept: the next turn reads again (what the announced change wrote, here one that
    # no listener of this test hears).
    await remember("city", "Alice lives in Lyon.")
    assert await facts() == ("Alice works in sales.", "Alice lives in Lyon.")
    # A read nothing overtook is kept.
    await remember("pet", "Alice has a cat.")
    assert await facts() == ("Alice works in sales.", "Alice lives in Lyon.")
