"""The data of `context.py` written into a migrated database: the organization, users with
memory facts and archived sessions, sessions of a given length with their compactions and
channels (rows from `context_rows`), and a user's long history inserted in bulk."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from context_rows import (
    MESSAGE_INTERVAL,
    ORG_ID,
    RARE_QUESTION,
    TextSource,
    TranscriptPlanner,
    history_rows,
)
from sqlalchemy import insert, update

from sessions.compaction import CompactionPolicy
from sessions.lifecycle import transition
from sessions.memory import MemoryFact
from storage.database import Database
from storage.models import (
    Session,
    SessionChannel,
    SessionCompaction,
    SessionMessage,
    SessionStatus,
    SessionSummary,
)
from storage.repositories.memory import MemoryRepository
from storage.repositories.sessions import SessionRepository
from storage.repositories.summaries import SummaryRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from storage.transcripts import SessionRef

# Rows per INSERT: one multi-row statement, so the database's recall triggers index (and
# count) a batch at once, and within SQLite's limit of bound values per statement.
BATCH_ROWS = 2_000
HISTORY_USER = "u-history"
CURRENT_SESSION_MESSAGES = 60  # one thread block: the last ten are in a thread
MEMORY_FACTS = 30
ARCHIVED_SESSIONS = 3
ARCHIVED_SESSION_MESSAGES = 12
NEIGHBOURS = 10  # the other users of `history_user(neighbour_turns=...)`


@dataclass(frozen=True, slots=True)
class LoadedSession:
    """A session in the database, and what the benchmark needs to know of it."""

    session_id: str
    messages: int
    compactions: int
    since_last_compaction: int
    thread_id: str
    load_s: float


async def insert_batches(database: Database, table: Any, rows: Iterable[dict[str, Any]]) -> int:
    """Insert `rows` `BATCH_ROWS` at a time, one statement and transaction each; how many."""
    total = 0
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= BATCH_ROWS:
            async with database.session() as db:
                await db.execute(insert(table).values(batch))
            total += len(batch)
            batch = []
    if batch:
        async with database.session() as db:
            await db.execute(insert(table).values(batch))
        total += len(batch)
    return total


@dataclass
class DataLoader:
    """Writes the benchmark's organization, users and sessions into one database: sessions
    compacted as `policy` would compact them, worded by `texts`, the latest ending at `now`."""

    database: Database
    policy: CompactionPolicy
    texts: TextSource
    now: datetime
    sessions: int = 0  # numbers the sessions, so that their thread ids never collide

    async def organization(self) -> None:
        """The organization every user belongs to."""
        context = self.texts.text(300, 600)
        async with self.database.session() as db:
            await OrganizationRepository(db).upsert(ORG_ID, "Acme Corp", context=context)

    async def add_user(self, user_id: str) -> None:
        """The user's row (again: an upsert)."""
        async with self.database.session() as db:
            await UserRepository(db).upsert(user_id, ORG_ID, f"Bench {user_id}")

    async def session(
        self, user_id: str, size: int, *, ended: datetime | None = None, last_question: str = ""
    ) -> LoadedSession:
        """Create a session of `size` messages, ending at `ended` (else now), with its
        compactions and counters. `last_question` is appended to its last user message (the
        query of the turn's recall search)."""
        self.sessions += 1
        started = time.perf_counter()
        start = (ended or self.now) - MESSAGE_INTERVAL * (size + 10)
        async with self.database.session() as db:
            session = await SessionRepository(db).create(user_id, ORG_ID, at=start)
        planner = TranscriptPlanner(
            SessionRef(ORG_ID, user_id, session.id),
            size,
            ordinal=self.sessions,
            policy=self.policy,
            texts=self.texts,
            start=start,
            last_question=last_question,
        )
        await insert_batches(self.database, SessionMessage.__table__, planner.messages())
        await insert_batches(self.database, SessionCompaction.__table__, planner.compactions)
        await insert_batches(self.database, SessionChannel.__table__, planner.channel_rows())
        counters = planner.counters()
        async with self.database.session() as db:
            await db.execute(update(Session).where(Session.id == session.id).values(counters))
        return LoadedSession(
            session_id=session.id,
            messages=size,
            compactions=len(planner.compactions),
            since_last_compaction=len(planner.since),
            thread_id=planner.recent_thread(),
            load_s=time.perf_counter() - started,
        )

    async def user(self, user_id: str) -> None:
        """A user with their memory facts and archived sessions with summaries."""
        await self.add_user(user_id)
        texts = self.texts
        archived: list[str] = []
        for number in range(ARCHIVED_SESSIONS):
            ended = self.now - timedelta(days=1 + 2 * number)
            loaded = await self.session(user_id, ARCHIVED_SESSION_MESSAGES, ended=ended)
            archived.append(loaded.session_id)
            async with self.database.session() as db:
                stored = await SessionRepository(db).get(loaded.session_id)
                if stored is not None:
                    transition(stored, SessionStatus.ARCHIVED, at=ended, reason="benchmark data")
                await SummaryRepository(db).add(
                    SessionSummary(
                        session_id=loaded.session_id,
                        user_id=user_id,
                        summary=texts.text(250, 600),
                        topics=["pricing page", "release notes"],
                        message_count=ARCHIVED_SESSION_MESSAGES,
                        created_at=ended,
                    )
                )
        async with self.database.session() as db:
            memory = MemoryRepository(db)
            for number in range(MEMORY_FACTS):
                fact = MemoryFact(
                    texts.random.choice(("preference", "identity", "commitment", "fact")),
                    f"{texts.sentence()} (noted {number + 1})",
                )
                await memory.remember(
                    user_id,
                    fact_key=fact.key,
                    fact=fact.fact,
                    category=fact.category,
                    source_session_id=archived[number % len(archived)],
                    at=self.now - timedelta(hours=MEMORY_FACTS - number),
                )

    async def history(self, user_id: str, turns: int, *, ended: datetime) -> float:
        """Insert the user's long history in bulk (about `BATCH_ROWS` messages a statement and
        transaction, with their sessions and summaries); the seconds it took."""
        started = time.perf_counter()
        pending: list[tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]] = []

        async def flush() -> None:
            async with self.database.session() as db:
                await db.execute(insert(Session.__table__).values([s for s, _, _ in pending]))
                messages = [m for _, ms, _ in pending for m in ms]
                await db.execute(insert(SessionMessage.__table__).values(messages))
                summaries = [summary for _, _, summary in pending]
                await db.execute(insert(SessionSummary.__table__).values(summaries))
            pending.clear()

        for rows in history_rows(user_id, turns, self.texts, ended=ended):
            pending.append(rows)
            if sum(len(messages) for _, messages, _ in pending) >= BATCH_ROWS:
                await flush()
        if pending:
            await flush()
        return time.perf_counter() - started

    async def sized_user(self, size: int) -> LoadedSession:
        """A user of their own, `u-size-SIZE`, whose current session has `size` messages."""
        user_id = f"u-size-{size}"
        await self.add_user(user_id)
        loaded = await self.session(user_id, size)
        # Written after the session's messages, as a gateway writes them (ids follow time).
        await self.user(user_id)
        return loaded

    async def history_user(
        self, turns: int, *, neighbour_turns: int = 0
    ) -> tuple[LoadedSession, float]:
        """`HISTORY_USER` with `turns` indexed turns in earlier sessions and a short current
        session that asks about a rare word far back; that session, and the seconds the
        history (and the neighbours' turns) took to insert.

        `neighbour_turns`: other users' turns (`NEIGHBOURS` colleagues, from the same texts,
        the client's name included) written after the user's long history and before their
        recent sessions, as on a database the user shares with others who went on talking
        meanwhile."""
        # In the order a gateway writes them: the long history first (it ends a week ago),
        # the neighbours' turns, then the user's three recent archived sessions, then the
        # current session.
        await self.add_user(HISTORY_USER)
        ended = self.now - timedelta(days=2 * ARCHIVED_SESSIONS + 1)
        load_s = await self.history(HISTORY_USER, turns, ended=ended)
        for number in range(NEIGHBOURS if neighbour_turns else 0):
            neighbour = f"u-neighbour-{number}"
            await self.add_user(neighbour)
            share = neighbour_turns // NEIGHBOURS + (number < neighbour_turns % NEIGHBOURS)
            load_s += await self.history(neighbour, share, ended=ended + timedelta(hours=12))
        await self.user(HISTORY_USER)
        current = await self.session(
            HISTORY_USER, CURRENT_SESSION_MESSAGES, last_question=RARE_QUESTION
        )
        return current, load_s
