"""Context assembly: the time of `SessionEngine.assemble_context` for sessions of 100, 10,000
and 100,000 messages, and for a short session of a user with a long history, on SQLite and
PostgreSQL.

Two goals:

- assembly costs what is sent, not how long the session is: the p50 of the 100,000-message
  session is within 1.5x of the 100-message one's;
- assembly does not cost what the user's whole history costs: for a user with 100,000 indexed
  turns in earlier sessions and a short current session, the p95 (outside and inside a
  thread) is at most 15 ms. Every turn searches the user's earlier conversations (recall), so
  this is where a search that grows with the history shows.

Every case is a user of its own (a session of 100 messages is not measured on a user whose
index also holds the 100,000-message session). For each backend it builds a database (a
temporary SQLite file; a throwaway PostgreSQL database `gateway_bench_*`, dropped afterwards),
migrates it, and loads the users' sessions shaped the way a running gateway leaves them:

- user and assistant messages alternate (200-600 characters of sentences, `tokens` = chars/4);
  the last ten of every sixty are in a thread;
- compactions as the engine's default policy (`GatewayConfig()`) leaves them, found by running
  its own rules (`CompactionPolicy.needed`, `split_point`) at every user message: about one per
  180 messages, contiguous message ranges, summaries of 1,500-6,000 characters, archive keys;
- the session's counters (`last_seq`, message counts, tokens, `compaction_count`), its channel
  and threads; per user 30 memory facts and 3 archived sessions with summaries, so every query
  of assembly returns rows;
- the long history (`--history-turns`, default 100,000): archived sessions of 300 turns, one a
  day before the current session, each with its session summary, inserted in bulk (the
  database's triggers index every row as in production). A client's name comes up in one turn
  of 5,000 of them, and the current session's last question asks about it, so the search
  has a rare word to find far back as well as common ones nearby;
- with `--neighbour-turns N` (default 0), N turns of ten other users of the organisation
  (the same kind of text, the client's name as often) written after that long history and
  before the user's recent sessions: a database shared with colleagues who went on talking
  while the user was away, so that the user's most recent entries are interleaved with
  theirs.

With the recall model installed, every entry's vector is then written (as `gateway recall
reindex` does), so the automatic search is hybrid, as in the gateway (`dense_recall`).

Then, with the engine built as the gateway builds it (`open_engine`, offline LLM, recall on),
it times `assemble_context(session_id)` and `assemble_context(session_id, thread_id)` for a
thread with recent messages: warm-up calls first, then `--runs` rounds, each round calling
every case once (interleaved, so a change of machine load hits all cases alike).
PostgreSQL's tables are vacuumed and analyzed after loading (VACUUM ANALYZE), as autovacuum
would have done in a running gateway, and so that autovacuum has no reason to start on the
freshly loaded tables during the timing; SQLite's full-text index is merged into one
segment, as the gateway's background job keeps it (`BackgroundJobs.merge_recall_index`), and
its tables are not analyzed (the gateway does not).

Run it (PostgreSQL on 127.0.0.1:5432, trust auth):

    .venv/bin/python bench/context.py
    .venv/bin/python bench/context.py --backends sqlite --sizes 100,10000 --runs 20
    .venv/bin/python bench/context.py --sizes '' --neighbour-turns 50000

Only the JSON object goes to stdout (the gateway's log lines, warnings and up, and the progress
go to stderr): per backend and session size the p50, p95 and mean in ms, `messages_sent` and
`history_tokens` of the assembled request, `rows_read` (messages loaded: those since the last
compaction), `indexed_turns` (the user's recall index), the same for the thread turn, and
`ratio_p50` (largest/smallest size against the goal, and every size's ratio); under
`history`, the same figures for the user with the long history against the p95 goal, and
`recalled_far_back_turn`: the share of the measured calls whose context held a passage of an
earlier session that names the client (the search found it through its rare word). The exit
code is 1 when a goal is not met on some backend, 2 when the benchmark could not run.

The rows are made in `context_rows` (no I/O) and written by `context_data`, the command line
is `context_settings`; this module times the assembly and reports.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from benchkit import BenchError, progress, throwaway_database
from context_data import CURRENT_SESSION_MESSAGES, HISTORY_USER, DataLoader, LoadedSession
from context_rows import RARE_NAME, TextSource
from context_settings import BenchSettings, parse_settings
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from errors import StorageError
from gateway.log import configure_logging
from gateway.open_services import open_engine
from gateway.settings import GatewayConfig
from primitives.collector import settle_after_start
from sessions.engine import SessionEngine
from sessions.llm import OfflineLLM
from storage.column_types import utcnow
from storage.database import Database
from storage.local_transcripts import LocalTranscriptStore
from storage.recall_index import RecallIndexRepository, merge_full_text
from storage.recall_vectors import rebuild_vectors

GOAL_RATIO = 1.5
GOAL_HISTORY_P95_MS = 15.0
SEED = 20240601


# --- measuring ----------------------------------------------------------------------------


@dataclass(slots=True)
class Case:
    """One timed call: a session, outside threads or in one, and its samples."""

    session: LoadedSession
    thread_id: str
    seconds: list[float] = field(default_factory=list)
    # The event loop's CPU of each call (the only work running meanwhile): steadier than the
    # wall time on a machine whose speed varies, and what the assembly costs a busy gateway.
    # SQLite's statements run in its connections' threads, not counted here.
    cpu_seconds: list[float] = field(default_factory=list)
    messages_sent: int = 0
    history_tokens: int = 0
    rows_read: int = 0
    # The long history's case: the calls whose context held an earlier passage naming the
    # client (found through its rare word), out of those made.
    recalled: int = 0

    async def call(self, engine: SessionEngine) -> tuple[float, float]:
        """Assemble the context once; the seconds it took, and the event loop's CPU seconds."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        context, rows_read = await engine.assemble_context(self.session.session_id, self.thread_id)
        elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
        self.messages_sent = len(context.request.messages)
        self.history_tokens = context.history_tokens
        self.rows_read = rows_read
        # Only recalled passages of earlier sessions are in the system prompt.
        self.recalled += RARE_NAME in context.request.system
        return elapsed, cpu

    def figures(self) -> dict[str, Any]:
        """p50/p95 (nearest rank), mean, and what the assembled request held."""
        ordered = sorted(self.seconds)

        def rank_ms(q: float) -> float:
            return round(ordered[max(math.ceil(q * len(ordered)) - 1, 0)] * 1000, 3)

        return {
            "p50_ms": rank_ms(0.50),
            "p95_ms": rank_ms(0.95),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
            "event_loop_cpu_ms_mean": round(statistics.fmean(self.cpu_seconds) * 1000, 3),
            "messages_sent": self.messages_sent,
            "history_tokens": self.history_tokens,
            "rows_read": self.rows_read,
        }

    def recalled_share(self, calls: int) -> float:
        """The share of the measured calls whose context named the client."""
        return round(self.recalled / calls, 3) if calls else 0.0


async def measure(engine: SessionEngine, cases: Sequence[Case], *, runs: int, warmup: int) -> None:
    """Warm up, then `runs` rounds calling every case once (interleaved)."""
    for _ in range(warmup):
        for case in cases:
            await case.call(engine)
    for case in cases:
        case.recalled = 0
    for number in range(runs):
        for case in cases:
            elapsed, cpu = await case.call(engine)
            case.seconds.append(elapsed)
            case.cpu_seconds.append(cpu)
        if (number + 1) % 10 == 0:
            progress(f"  {number + 1}/{runs} rounds")


async def indexed_entries(database: Database, user_id: str) -> int:
    """How many entries the user's recall index holds."""
    async with database.session() as db:
        return await RecallIndexRepository(db).count(user_id)


async def run_backend(
    url: str, settings: BenchSettings, workdir: Path, *, analyze: bool
) -> dict[str, Any]:
    """Load the users into the database at `url` and time their context assembly."""
    database = Database(url)
    try:
        await database.upgrade()
        # Dense recall as `make run` has it (the example config turns it on).
        config = GatewayConfig.model_validate({"recall": {"dense": True}})
        engine = open_engine(
            config, database, LocalTranscriptStore(workdir / "transcripts"), OfflineLLM(), utcnow
        )
        loader = DataLoader(database, engine.settings.compaction, TextSource(SEED), utcnow())
        await loader.organization()
        sized: dict[int, LoadedSession] = {}
        for size in settings.sizes:
            loaded = await loader.sized_user(size)
            progress(
                f"  loaded {size} messages, {loaded.compactions} compactions "
                f"in {loaded.load_s:.1f}s"
            )
            sized[size] = loaded
        history: LoadedSession | None = None
        history_load_s = 0.0
        if settings.history_turns:
            history, history_load_s = await loader.history_user(
                settings.history_turns, neighbour_turns=settings.neighbour_turns
            )
            progress(
                f"  loaded {settings.history_turns} history turns "
                f"({settings.neighbour_turns} of other users after them) in "
                f"{history_load_s:.1f}s and a session of {CURRENT_SESSION_MESSAGES} messages"
            )
        if engine.embedder is not None:
            # The rows went in as bulk INSERTs: their vectors are written as `gateway recall
            # reindex` writes them (a turn writes its own as it stores its messages).
            began = time.perf_counter()
            async with database.session() as db:
                embedded = await rebuild_vectors(db, engine.embedder)
            progress(f"  embedded {embedded} entries in {time.perf_counter() - began:.1f}s")
        if analyze:
            # VACUUM runs outside a transaction.
            autocommit = database.engine.execution_options(isolation_level="AUTOCOMMIT")
            async with autocommit.connect() as conn:
                await conn.execute(text("VACUUM ANALYZE"))
        # SQLite: the full-text index merged, as the gateway's background job keeps it
        # (`BackgroundJobs.merge_recall_index`); the bulk load left it in many segments.
        began = time.perf_counter()
        merge_steps = await merge_full_text(database)
        if merge_steps:
            progress(f"  merged the full-text index in {time.perf_counter() - began:.1f}s")
        indexed = {size: await indexed_entries(database, f"u-size-{size}") for size in sized}
        cases = {size: (Case(s, ""), Case(s, s.thread_id)) for size, s in sized.items()}
        history_cases = (Case(history, ""), Case(history, history.thread_id)) if history else ()
        every_case = [case for pair in cases.values() for case in pair] + list(history_cases)
        # The collector as a serving gateway process sets it once started.
        settle_after_start()
        progress(f"  timing: {settings.warmup} warm-up and {settings.runs} measured rounds")
        await measure(engine, every_case, runs=settings.runs, warmup=settings.warmup)
        history_indexed = await indexed_entries(database, HISTORY_USER) if history else 0
    finally:
        await database.dispose()
    result: dict[str, Any] = {
        "analyzed": analyze,
        "full_text_merged": merge_steps > 0,
        "dense_recall": engine.vectors is not None and engine.database.embedder is not None,
        "sizes": {},
    }
    for size, (main, threaded) in cases.items():
        result["sizes"][str(size)] = {
            **main.figures(),
            "indexed_entries": indexed[size],
            "compactions": main.session.compactions,
            "load_s": round(main.session.load_s, 2),
            "thread": threaded.figures(),
        }
    if cases:
        result["ratio_p50"] = size_ratio(cases)
    if history_cases:
        main, threaded = history_cases
        worst_p95 = max(main.figures()["p95_ms"], threaded.figures()["p95_ms"])
        result["history"] = {
            **main.figures(),
            "history_turns": settings.history_turns,
            "neighbour_turns": settings.neighbour_turns,
            "indexed_entries": history_indexed,
            "current_session_messages": CURRENT_SESSION_MESSAGES,
            "load_s": round(history_load_s, 2),
            "thread": threaded.figures(),
            "recalled_far_back_turn": {
                "share_of_calls": main.recalled_share(settings.runs),
                "thread": threaded.recalled_share(settings.runs),
            },
            "goal_p95_ms": GOAL_HISTORY_P95_MS,
            "met": worst_p95 <= GOAL_HISTORY_P95_MS,
        }
    return result


def size_ratio(cases: dict[int, tuple[Case, Case]]) -> dict[str, Any]:
    """The p50 of the longest session against the shortest's, and every size's ratio."""
    # The goal compares the longest session with the shortest; the ratio of every size is
    # shown too, since a middle size can be the slow one (the planner's estimates vary).
    smallest, largest = min(cases), max(cases)
    base = cases[smallest][0].figures()["p50_ms"]
    ratios = {size: main.figures()["p50_ms"] / base for size, (main, _) in cases.items()}
    return {
        "of": f"{largest}/{smallest}",
        "value": round(ratios[largest], 3),
        "goal": GOAL_RATIO,
        "met": ratios[largest] <= GOAL_RATIO,
        "every_size": {str(size): round(ratio, 3) for size, ratio in ratios.items()},
        "met_at_every_size": max(ratios.values()) <= GOAL_RATIO,
    }


# --- databases ----------------------------------------------------------------------------


def database_url(admin_url: str, database: str) -> str:
    """The admin URL pointed at `database`, for SQLAlchemy's psycopg driver."""
    parts = urlsplit(admin_url)
    return urlunsplit(parts._replace(scheme="postgresql+psycopg", path=f"/{database}"))


def run_one(backend: str, settings: BenchSettings) -> dict[str, Any]:
    """Run the benchmark on one backend, with its database made and removed around it."""
    with tempfile.TemporaryDirectory(prefix="gateway-bench-context-") as folder:
        workdir = Path(folder)
        if backend == "sqlite":
            url = f"sqlite+aiosqlite:///{workdir / 'gateway.db'}"
            return asyncio.run(run_backend(url, settings, workdir, analyze=False))
        with throwaway_database(settings.admin_url) as name:
            progress(f"  database {name}")
            url = database_url(settings.admin_url, name)
            return asyncio.run(run_backend(url, settings, workdir, analyze=True))


def _interrupt_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the throwaway database is dropped


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    settings = parse_settings(argv)
    # The engine logs every turn's recall at info; only the JSON goes to stdout.
    configure_logging("console", "warning")
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "settings": {
            "sizes": list(settings.sizes),
            "history_turns": settings.history_turns,
            "neighbour_turns": settings.neighbour_turns,
            "runs": settings.runs,
            "warmup": settings.warmup,
            "policy": "GatewayConfig() defaults",
        },
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1min_at_start": round(os.getloadavg()[0], 2),
        },
        "backends": {},
    }
    try:
        for backend in settings.backends:
            progress(f"{backend}:")
            result["backends"][backend] = run_one(backend, settings)
    except (BenchError, StorageError, SQLAlchemyError, psycopg.Error) as exc:
        progress(f"the benchmark could not run: {exc}")
        return 2
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    result["total_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=2))
    met = all(
        figures.get("ratio_p50", {"met": True})["met"]
        and figures.get("history", {"met": True})["met"]
        for figures in result["backends"].values()
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
