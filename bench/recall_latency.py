"""Recall latency: p50/p95 of `RecallSearch.search` for a user with 100,000 indexed turns on
PostgreSQL, with other users' rows in the same tables: the automatic search of every turn
(goal: p95 <= 50 ms) and the thorough one of the `search_past_conversations` tool.

It creates a throwaway PostgreSQL database `gateway_bench_*` (dropped afterwards), migrates
it, and loads, with the triggers of migration 0002 indexing every row as in production:

- the measured user: `--turns` turns (default 100,000) in sessions of 300 turns, one session
  a day, alternating user and assistant; each turn is a LoCoMo turn text (`--data`, sampled
  with a fixed seed, so words have the frequencies of real chat), with a session summary for
  every session;
- `--other-users` other users (default 10) with `--other-turns` turns each (default 20,000),
  drawn from the same texts, so the GIN index and the tables hold other users' rows too.

Rows go in as multi-row INSERTs (one statement indexes, and counts the statistics of, a whole
batch). It then ANALYZEs (as autovacuum would have) and times `search(user, question, 10)`
(automatic) and `search(user, question, 10, thorough=True)` (the tool's) with the default
ranking for `--queries` LoCoMo questions (warm-up first), each a real question that the user
has never asked before.

    .venv/bin/python bench/recall_latency.py --data ../shared/bench-data/locomo/locomo_dev.json

With the recall model installed, every entry's vector is written first (as `gateway recall
reindex` does; its CPU per entry is reported) and the searches are hybrid, the query's
embedding included in the time (`full_text_only` times the automatic search without
vectors); `first_search_ms` is the first search, which reads the user's 100,000 vectors
into memory. `indexing` then times the CPU of storing turns (`store_turn_messages`, a user
message and an answer each) with and without their vectors: the indexing cost per message
dense recall adds (goal: <= 2 ms).

One JSON object goes to stdout (p50/p95/p99/mean in ms of both searches, the load sizes),
progress to stderr. Exit code 1 when the automatic search's p95 goal is not met, 2 when it
could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from benchkit import BenchError, progress, throwaway_database
from sqlalchemy import insert, text
from sqlalchemy.exc import SQLAlchemyError

from errors import StorageError
from gateway.log import configure_logging
from sessions.recall import RecallSearch
from sessions.recall_embedding import installed_embedder
from sessions.recall_values import RecallOptions
from storage.database import Database
from storage.models import Session, SessionMessage, SessionSummary
from storage.recall_vectors import rebuild_vectors
from storage.repositories.sessions import SessionRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from storage.turn_store import MessageToStore, store_turn_messages
from storage.vector_index import VectorIndex

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
GOAL_P95_MS = 50.0
SESSION_TURNS = 300
BATCH = 2_000  # rows per INSERT statement, within the driver's limit of bound values
SEED = 8
WRITE_TURNS = 300  # turns (of two messages) stored to time the indexing cost
USER_ID = "u-measured"
T0 = datetime(2023, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """The command line, validated."""

    data: Path
    turns: int
    other_users: int
    other_turns: int
    queries: int
    warmup: int
    admin_url: str


def load_texts(path: Path) -> tuple[list[str], list[str]]:
    """Every turn text and every question of a LoCoMo-format file."""
    samples = json.loads(path.read_text(encoding="utf-8"))
    turns = [
        str(turn["text"])
        for sample in samples
        for key, value in sample["conversation"].items()
        if key.startswith("session_") and isinstance(value, list)
        for turn in value
    ]
    questions = [str(qa["question"]) for sample in samples for qa in sample["qa"]]
    return turns, questions


def session_rows(
    user_id: str, count: int, texts: Sequence[str], rng: random.Random
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]]:
    """Sessions of `SESSION_TURNS` turns: the session row, its messages, its summary."""
    for first in range(0, count, SESSION_TURNS):
        day = T0 + timedelta(days=first // SESSION_TURNS)
        session_id = uuid.uuid4().hex
        size = min(SESSION_TURNS, count - first)
        session = {
            "id": session_id,
            "user_id": user_id,
            "org_id": "acme",
            "status": "archived",
            "created_at": day,
            "updated_at": day,
            "last_active_at": day,
            "current_since": day,
            "archived_at": day + timedelta(hours=2),
            "message_count": size,
            "last_seq": size,
        }
        messages = [
            {
                "session_id": session_id,
                "seq": index + 1,
                "role": "user" if index % 2 == 0 else "assistant",
                "channel_type": "web",
                "thread_id": "",
                "content": rng.choice(texts),
                "tokens": 0,
                "created_at": day + timedelta(seconds=20 * index),
                "metadata": {},
            }
            for index in range(size)
        ]
        summary = {
            "session_id": session_id,
            "user_id": user_id,
            "summary": " ".join(rng.choice(texts) for _ in range(6)),
            "topics": [],
            "message_count": size,
            "created_at": day + timedelta(hours=2),
        }
        yield session, messages, summary


async def load_user(
    database: Database, user_id: str, count: int, texts: Sequence[str], rng: random.Random
) -> None:
    """One user and their sessions, messages and summaries (indexed by the triggers)."""
    async with database.session() as db:
        await UserRepository(db).upsert(user_id, "acme", user_id.title())
    pending: list[tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]] = []

    async def flush() -> None:
        async with database.session() as db:
            await db.execute(insert(Session).values([s for s, _, _ in pending]))
            messages = [m for _, ms, _ in pending for m in ms]
            await db.execute(insert(SessionMessage).values(messages))
            await db.execute(insert(SessionSummary).values([m for _, _, m in pending]))
        pending.clear()

    for row in session_rows(user_id, count, texts, rng):
        pending.append(row)
        if sum(len(messages) for _, messages, _ in pending) >= BATCH:
            await flush()
    if pending:
        await flush()


def rank_ms(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank percentile in ms."""
    return round(ordered[max(math.ceil(q * len(ordered)) - 1, 0)] * 1000, 2)


async def run(url: str, settings: BenchSettings) -> dict[str, Any]:
    """Load, analyze, time."""
    turns, questions = load_texts(settings.data)
    rng = random.Random(SEED)
    database = Database(url)
    try:
        await database.upgrade()
        async with database.session() as db:
            await OrganizationRepository(db).upsert("acme", "Acme")
        started = time.perf_counter()
        await load_user(database, USER_ID, settings.turns, turns, rng)
        progress(f"  loaded {settings.turns} turns in {time.perf_counter() - started:.0f}s")
        for number in range(settings.other_users):
            await load_user(database, f"u-other-{number}", settings.other_turns, turns, rng)
        progress(f"  loaded the other users in {time.perf_counter() - started:.0f}s")
        async with database.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text("VACUUM ANALYZE"))
        async with database.session() as db:
            entries = (
                await db.execute(
                    text(
                        "SELECT count(*) FILTER (WHERE user_id = :u), count(*) FROM recall_entries"
                    ),
                    {"u": USER_ID},
                )
            ).one()
            size = (
                await db.execute(
                    text(
                        "SELECT pg_size_pretty(pg_total_relation_size('recall_entries')), "
                        "pg_size_pretty(pg_relation_size('recall_entries_tsv')), "
                        "pg_size_pretty(pg_total_relation_size('recall_stats'))"
                    )
                )
            ).one()
        vectors, indexing = await load_vectors(database)
        recall = RecallSearch(database, vectors=vectors)
        order = random.Random(SEED + 1).sample(questions, len(questions))
        asked = (order * (1 + (settings.queries + settings.warmup) // len(order)))[
            : settings.queries + settings.warmup
        ]
        began = time.perf_counter()
        await recall.search(USER_ID, asked[0], 10)
        first_ms = round((time.perf_counter() - began) * 1000, 1)
        automatic = await time_searches(recall, asked, settings.warmup, thorough=False)
        thorough = await time_searches(recall, asked, settings.warmup, thorough=True)
        if vectors is not None:
            indexing |= await time_turn_writes(database, turns, rng)
        full_text = await time_searches(
            RecallSearch(database, RecallOptions(dense=False)),
            asked,
            settings.warmup,
            thorough=False,
        )
    finally:
        await database.dispose()
    return {
        "user_entries": entries[0],
        "all_entries": entries[1],
        "recall_entries_size": size[0],
        "gin_index_size": size[1],
        "recall_stats_size": size[2],
        "queries": settings.queries,
        **automatic,
        "goal_p95_ms": GOAL_P95_MS,
        "met": automatic["p95_ms"] <= GOAL_P95_MS,
        "dense": vectors is not None,
        "first_search_ms": first_ms,
        "thorough": thorough,
        "full_text_only": full_text,
        "indexing": indexing,
    }


async def load_vectors(database: Database) -> tuple[VectorIndex | None, dict[str, Any]]:
    """Every entry's vector (as `gateway recall reindex` writes them), timed; the index to
    search them with (None when the model is not installed: full text only)."""
    embedder = installed_embedder()
    if embedder is None:
        progress("  the recall model is not installed: full-text search only")
        return None, {}
    began, cpu = time.perf_counter(), time.process_time()
    async with database.session() as db:
        count = await rebuild_vectors(db, embedder)
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu
    progress(f"  embedded {count} entries in {seconds:.0f}s")
    database.use_embedder(embedder)
    return VectorIndex(embedder), {
        "reindex_entries": count,
        "reindex_s": round(seconds, 1),
        "reindex_cpu_ms_per_entry": round(cpu_seconds * 1000 / max(count, 1), 3),
    }


async def time_turn_writes(
    database: Database, texts: Sequence[str], rng: random.Random
) -> dict[str, Any]:
    """The gateway's CPU per message stored by a turn (`store_turn_messages`: a user message
    and an answer), with and without embedding them: the indexing cost dense recall adds."""
    async with database.session() as db:
        await UserRepository(db).upsert("u-writer", "acme", "Writer")
    figures: dict[str, float] = {}
    embedder = database.embedder
    for label, used in (("without", None), ("with", embedder), ("without_again", None)):
        database.use_embedder(used)
        async with database.session() as db:
            session = await SessionRepository(db).create("u-writer", "acme", at=T0)
        cpu = time.process_time()
        for _ in range(WRITE_TURNS):
            async with database.session() as db:
                await store_turn_messages(
                    db,
                    session.id,
                    [
                        MessageToStore("user", "web", rng.choice(texts), 0),
                        MessageToStore("assistant", "web", rng.choice(texts), 0),
                    ],
                    at=T0,
                )
        figures[label] = (time.process_time() - cpu) * 1000 / (2 * WRITE_TURNS)
    database.use_embedder(embedder)
    without = (figures["without"] + figures["without_again"]) / 2
    return {
        "turn_write_cpu_ms_per_message_without_vectors": round(without, 3),
        "turn_write_cpu_ms_per_message_with_vectors": round(figures["with"], 3),
        "vector_cpu_ms_per_message": round(figures["with"] - without, 3),
        "goal_vector_cpu_ms_per_message": 2.0,
    }


async def time_searches(
    recall: RecallSearch, asked: Sequence[str], warmup: int, *, thorough: bool
) -> dict[str, Any]:
    """Run every question (the first `warmup` untimed); p50/p95/p99/mean in ms, mean hits."""
    seconds: list[float] = []
    found: list[int] = []
    for index, question in enumerate(asked):
        began = time.perf_counter()
        hits = await recall.search(USER_ID, question, 10, thorough=thorough)
        if index >= warmup:
            seconds.append(time.perf_counter() - began)
            found.append(len(hits))
    ordered = sorted(seconds)
    return {
        "p50_ms": rank_ms(ordered, 0.50),
        "p95_ms": rank_ms(ordered, 0.95),
        "p99_ms": rank_ms(ordered, 0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
        "mean_hits": round(statistics.fmean(found), 1),
    }


def database_url(admin_url: str, database: str) -> str:
    """The admin URL pointed at `database`, for SQLAlchemy's psycopg driver."""
    parts = urlsplit(admin_url)
    return urlunsplit(parts._replace(scheme="postgresql+psycopg", path=f"/{database}"))


def parse_settings(argv: Sequence[str] | None) -> BenchSettings:
    """The command line."""
    parser = argparse.ArgumentParser(description="Recall search latency on PostgreSQL.")
    parser.add_argument("--data", type=Path, required=True, help="LoCoMo-format JSON (texts)")
    parser.add_argument("--turns", type=int, default=100_000, help="the user's turns (100000)")
    parser.add_argument("--other-users", type=int, default=10, help="other users (10)")
    parser.add_argument("--other-turns", type=int, default=20_000, help="their turns (20000)")
    parser.add_argument("--queries", type=int, default=500, help="timed searches (500)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed searches first (20)")
    parser.add_argument("--database-url", default=DEFAULT_ADMIN_URL, help="PostgreSQL admin URL")
    args = parser.parse_args(argv)
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file")
    if args.turns < 1 or args.queries < 1 or args.other_users < 0 or args.warmup < 0:
        parser.error("--turns and --queries must be positive")
    return BenchSettings(
        args.data,
        args.turns,
        args.other_users,
        args.other_turns,
        args.queries,
        args.warmup,
        args.database_url,
    )


def _interrupt_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the throwaway database is dropped


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    settings = parse_settings(argv)
    configure_logging("console", "warning")
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    result: dict[str, Any] = {
        "settings": {
            "turns": settings.turns,
            "other_users": settings.other_users,
            "other_turns": settings.other_turns,
        },
        "machine": {"cores": os.cpu_count(), "load_average_1min": round(os.getloadavg()[0], 2)},
    }
    try:
        with throwaway_database(settings.admin_url) as name:
            progress(f"postgres: database {name}")
            result["postgres"] = asyncio.run(run(database_url(settings.admin_url, name), settings))
    except (BenchError, StorageError, SQLAlchemyError, psycopg.Error) as exc:
        progress(f"the benchmark could not run: {exc}")
        return 2
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    print(json.dumps(result, indent=2))
    return 0 if result["postgres"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
