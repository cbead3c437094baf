"""Users' memory changed, announced to every process (PostgreSQL): a change committed by any
connection drops that user's cached memory at once, and a listener that lost its connection
drops every copy when it is back."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from sqlalchemy import delete, text

from sessions.context_cache import MemoryCache
from sessions.memory import RetentionPolicy
from storage.database import Database
from storage.memory_signal import memory_listener
from storage.models import UserMemoryFact
from storage.repositories.memory import MemoryRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from tests.storage.listening import running, until

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


async def remember(database: Database, user_id: str, key: str, fact: str) -> None:
    async with database.session() as db:
        await MemoryRepository(db).remember(
            user_id, fact_key=key, fact=fact, category="fact", source_session_id=None, at=NOW
        )


async def facts_of(cache: MemoryCache, database: Database, user_id: str) -> tuple[str, ...]:
    async with database.session() as db:
        facts, _ = await cache.read(db, user_id, NOW)
    return facts


@contextlib.asynccontextmanager
async def listening(database: Database, cache: MemoryCache) -> AsyncIterator[list[str | None]]:
    """The cache following the announcements; each one heard, in order."""
    heard: list[str | None] = []

    def changed(user_id: str | None) -> None:
        heard.append(user_id)
        cache.changed(user_id)

    def lost() -> None:
        cache.unheard()
        heard.append(f"(lost: kept {cache._entries.ttl:.0f} s)")

    # Once connected, every copy dropped (the None heard first).
    async with running(memory_listener(database.url, changed, lost), heard):
        yield heard


async def test_a_change_in_any_process_drops_the_users_cached_memory(
    migrated_postgres_url: str,
) -> None:
    database, elsewhere = Database(migrated_postgres_url), Database(migrated_postgres_url)
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        for user_id in ("alice", "bob"):
            await UserRepository(db).upsert(user_id, "acme", user_id.title())
    await remember(database, "alice", "team", "Alice works in sales.")
    cache = MemoryCache(50, 3, RetentionPolicy(), ttl=60, announced_ttl=3600)
    async with listening(database, cache) as heard:
        assert cache._entries.ttl == 3600  # heard: copies kept longer
        assert await facts_of(cache, database, "alice") == ("Alice works in sales.",)
        assert await facts_of(cache, database, "bob") == ()
        # Another process learns a fact about Alice: her copy goes, Bob's stays.
        await remember(elsewhere, "alice", "city", "Alice lives in Lyon.")
        await until(lambda: "alice" in heard)
        assert await facts_of(cache, database, "alice") == (
            "Alice works in sales.",
            "Alice lives in Lyon.",
        )
        # Deleting many rows in one transaction is one announcement.
        async with elsewhere.session() as db:
            await db.execute(delete(UserMemoryFact).where(UserMemoryFact.user_id == "alice"))
        await until(lambda: heard.count("alice") == 2)
        assert await facts_of(cache, database, "alice") == ()
        assert heard == [None, "alice", "alice"]
        # The listener's connection is lost: back, it drops every copy (changes meanwhile
        # were not heard).
        async with elsewhere.engine.connect() as connection:
            await connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE query = 'LISTEN gateway_memory' AND pid <> pg_backend_pid()"
                )
            )
            await connection.commit()
        await until(lambda: heard[-1] is None)
        assert heard[-2] == "(lost: kept 60 s)"  # meanwhile, copies kept a minute again
        assert cache._entries.ttl == 3600
    await database.dispose()
    await elsewhere.dispose()
