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
  has a rare word to find far back as well as common ones nearby.

Then, with the engine built as the gateway builds it (`open_engine`, offline LLM, recall on),
it times `assemble_context(session_id)` and `assemble_context(session_id, thread_id)` for a
thread with recent messages: warm-up calls first, then `--runs` rounds, each round calling
every case once (interleaved, so a change of machine load hits all cases alike).
PostgreSQL's tables are ANALYZEd after loading, as autovacuum would have done in a running
gateway; SQLite is left as the gateway leaves it (no ANALYZE).

Run it (PostgreSQL on 127.0.0.1:5432, trust auth):

    .venv/bin/python bench/context.py
    .venv/bin/python bench/context.py --backends sqlite --sizes 100,10000 --runs 20

Only the JSON object goes to stdout (the gateway's log lines, warnings and up, and the progress
go to stderr): per backend and session size the p50, p95 and mean in ms, `messages_sent` and
`history_tokens` of the assembled request, `rows_read` (messages loaded: those since the last
compaction), `indexed_turns` (the user's recall index), the same for the thread turn, and
`ratio_p50` (largest/smallest size against the goal, and every size's ratio); under
`history`, the same figures for the user with the long history against the p95 goal. The exit
code is 1 when a goal is not met on some backend, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from benchkit import BenchError, progress, throwaway_database
from sqlalchemy import insert, text, update
from sqlalchemy.exc import SQLAlchemyError

from errors import StorageError
from gateway.log import configure_logging
from gateway.runtime import open_engine
from gateway.settings import GatewayConfig
from sessions.compaction import CompactionPolicy, split_point
from sessions.context import SUMMARY_LEAD_IN, HistoryMessage
from sessions.engine import SessionEngine
from sessions.lifecycle import transition
from sessions.llm import OfflineLLM, estimate_tokens
from sessions.memory import MemoryFact
from storage.database import Database
from storage.models import (
    Session,
    SessionChannel,
    SessionCompaction,
    SessionMessage,
    SessionStatus,
    SessionSummary,
    utcnow,
)
from storage.recall_index import RecallIndexRepository
from storage.repositories import (
    MemoryRepository,
    OrganizationRepository,
    SessionRepository,
    SummaryRepository,
    UserRepository,
)
from storage.transcripts import (
    LocalTranscriptStore,
    SessionRef,
    pre_compact_archive_key,
    transcript_segments_prefix,
)

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_SIZES = (100, 10_000, 100_000)
BACKENDS = ("sqlite", "postgres")
GOAL_RATIO = 1.5
GOAL_HISTORY_P95_MS = 15.0
# Rows per INSERT: one multi-row statement, so the database's recall triggers index (and
# count) a batch at once, and within SQLite's limit of bound values per statement.
BATCH_ROWS = 2_000
ORG_ID = "acme"
HISTORY_USER = "u-history"
DEFAULT_HISTORY_TURNS = 100_000
HISTORY_SESSION_TURNS = 300
CURRENT_SESSION_MESSAGES = 60  # one thread block: the last ten are in a thread
RARE_EVERY = 5_000  # history turns; one of them mentions the client
RARE_MENTION = "The Halvorsen renewal still waits for their procurement sign-off."
RARE_QUESTION = "Where did we leave the Halvorsen renewal?"
CHANNEL = "slack"
CHANNEL_ID = "D0BENCH"
MESSAGE_INTERVAL = timedelta(seconds=30)
THREAD_EVERY = 60  # messages; the last THREAD_LENGTH of each block are in a thread
THREAD_LENGTH = 10
MEMORY_FACTS = 30
ARCHIVED_SESSIONS = 3
ARCHIVED_SESSION_MESSAGES = 12
SEED = 20240601


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """The command line, validated."""

    sizes: tuple[int, ...]
    history_turns: int
    runs: int
    warmup: int
    backends: tuple[str, ...]
    admin_url: str


# --- realistic text -----------------------------------------------------------------------

SUBJECTS = (
    "the quarterly report",
    "the onboarding checklist",
    "our vendor contract",
    "the migration plan",
    "the customer escalation",
    "next week's offsite",
    "the hiring pipeline",
    "the security review",
    "the pricing page",
    "the release notes",
)
PEOPLE = ("Priya", "Marco", "the finance team", "legal", "Jonas", "the support lead", "Aiko")
TEMPLATES = (
    "Could you draft a short note to {person} about {subject} before {day}?",
    "I went through {subject} again and the numbers in section {n} still look off to me.",
    "Here is what I found: {subject} depends on two approvals, and {person} owns one of them.",
    "Let's keep the tone friendly but firm, since {person} asked for a decision by {day}.",
    "The main risk with {subject} is the timeline; we lose about {n} days if nothing changes.",
    "I would summarise it in three points and put the open questions for {person} at the end.",
    "Please remind me on {day} to follow up with {person} on {subject}.",
    "That works for me, but can we double-check the figures for {subject} with {person}?",
    "Good point. I updated the draft and moved the part about {subject} to the top.",
    "Based on the last {n} messages, the agreed next step is to send {subject} to {person}.",
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "the end of the month")


class TextSource:
    """Deterministic, realistic-looking message, summary and fact texts."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    def sentence(self) -> str:
        """One sentence of a work conversation."""
        pick = self.random.choice
        return pick(TEMPLATES).format(
            person=pick(PEOPLE), subject=pick(SUBJECTS), day=pick(DAYS), n=self.random.randint(2, 9)
        )

    def text(self, min_chars: int, max_chars: int, *, bullet: str = "") -> str:
        """Sentences (one per line when `bullet` starts them) filling 'min_chars..max_chars'."""
        target = self.random.randint(min_chars, max_chars)
        separator = "\n" if bullet else " "
        parts: list[str] = []
        length = 0
        while length < target:
            part = bullet + self.sentence()
            parts.append(part)
            length += len(part) + 1
        joined = separator.join(parts)
        return joined[:target].rsplit(" ", 1)[0].rstrip(",;.?") + "."

    def message(self) -> str:
        """A chat message."""
        return self.text(200, 600)

    def summary(self, number: int) -> str:
        """The summary of the n-th compaction: it folds the previous ones in, so it grows."""
        top = min(1_500 + 500 * number, 6_000)
        return self.text(max(top - 500, 1_500), top, bullet="- ")

    def facts(self) -> list[dict[str, str]]:
        """The facts a compaction extracted (often none)."""
        return [
            {"category": self.random.choice(("preference", "commitment", "fact")), "fact": f}
            for f in (self.sentence() for _ in range(self.random.choice((0, 0, 1, 2, 3))))
        ]


# --- sessions shaped like a running gateway's -----------------------------------------------


class TranscriptPlanner:
    """The rows of one session: its messages (streamed), compactions, channels and counters.

    Compactions are placed by the engine's own rules: at every user message (a turn) the
    policy decides whether the history since the last compaction needs one, and
    `split_point` decides how much of it goes, exactly as `Compactor` would.
    """

    def __init__(
        self,
        ref: SessionRef,
        size: int,
        *,
        ordinal: int,
        policy: CompactionPolicy,
        texts: TextSource,
        start: datetime,
        last_question: str = "",
    ) -> None:
        self.ref = ref
        self.last_question = last_question
        self.size = size
        self.ordinal = ordinal
        self.policy = policy
        self.texts = texts
        self.start = start
        self.compactions: list[dict[str, Any]] = []
        self.channel_messages: Counter[str] = Counter()  # thread id ('' for none) → messages
        self.roles: Counter[str] = Counter()
        self.input_tokens = 0
        self.output_tokens = 0
        self.last_at = start
        self.since: list[HistoryMessage] = []  # the messages after the last compaction
        self.summary: str | None = None

    def thread_of(self, index: int) -> str:
        """The thread of the index-th message ('' outside threads), unique to this session."""
        block, position = divmod(index, THREAD_EVERY)
        if position < THREAD_EVERY - THREAD_LENGTH:
            return ""
        opened = self.start + MESSAGE_INTERVAL * (block * THREAD_EVERY)
        return f"{int(opened.timestamp())}.{self.ordinal:03d}{block:03d}"

    def messages(self) -> Iterator[dict[str, Any]]:
        """The session's message rows, in sequence order (compactions are noted on the way)."""
        asked = ""
        for index in range(self.size):
            seq = index + 1
            role = "user" if index % 2 == 0 else "assistant"
            thread_id = self.thread_of(index)
            content = self.texts.message()
            if role == "user" and index >= self.size - 2 and self.last_question:
                content = f"{content} {self.last_question}"
            tokens = len(content) // 4
            at = self.start + MESSAGE_INTERVAL * index
            if role == "user":
                message_id = f"{int(at.timestamp())}.{seq:06d}"
                in_reply_to = None
                metadata: dict[str, Any] = {"channel_id": CHANNEL_ID}
                asked = message_id
            else:
                message_id = f"out-{uuid.uuid4().hex}"
                in_reply_to = asked
                metadata = {}
                self.output_tokens += tokens
            self.since.append(HistoryMessage(seq, role, content, tokens, thread_id))
            if role == "user":
                self.turn(at)
            self.roles[role] += 1
            self.channel_messages[thread_id] += 1
            self.last_at = at
            yield {
                "session_id": self.ref.session_id,
                "seq": seq,
                "role": role,
                "channel_type": CHANNEL,
                "thread_id": thread_id,
                "message_id": message_id,
                "in_reply_to": in_reply_to,
                "content": content,
                "tokens": tokens,
                "created_at": at,
                "metadata": metadata,
            }

    @property
    def summary_tokens(self) -> int:
        """What the latest summary costs in the context (as `sessions.context.assemble` counts)."""
        if self.summary is None:
            return 0
        block = f"<summary>\n{self.summary}\n</summary>"
        return estimate_tokens(block) + estimate_tokens(SUMMARY_LEAD_IN)

    def turn(self, at: datetime) -> None:
        """A turn starts: bill its context, and compact first when the policy says so."""
        history_tokens = self.summary_tokens + sum(m.cost for m in self.since)
        self.input_tokens += history_tokens
        if not self.policy.needed(history_tokens, len(self.since)):
            return
        cut = split_point(self.since, self.policy.keep_last_messages, self.policy.max_kept_tokens)
        if cut == 0:
            return
        compacted, kept = self.since[:cut], self.since[cut:]
        number = len(self.compactions) + 1
        summary = self.texts.summary(number)
        previous = estimate_tokens(self.summary) if self.summary else 0
        self.compactions.append(
            {
                "session_id": self.ref.session_id,
                "seq": number,
                "first_message_seq": compacted[0].seq,
                "last_message_seq": compacted[-1].seq,
                "messages_compacted": len(compacted),
                "tokens_before": sum(m.cost for m in self.since) + previous,
                "tokens_after": estimate_tokens(summary) + sum(m.cost for m in kept),
                "archive_ref": pre_compact_archive_key(self.ref, number),
                "summary": summary,
                "facts": self.texts.facts(),
                "created_at": at,
            }
        )
        self.since = kept
        self.summary = summary

    def channel_rows(self) -> list[dict[str, Any]]:
        """The session's `session_channels` rows (call after `messages` is exhausted)."""
        return [
            {
                "session_id": self.ref.session_id,
                "channel_type": CHANNEL,
                "channel_id": CHANNEL_ID,
                "thread_id": thread_id,
                "joined_at": self.start,
                "last_message_at": self.last_at,
                "message_count": count,
            }
            for thread_id, count in self.channel_messages.items()
        ]

    def counters(self) -> dict[str, Any]:
        """The session row's counters once every message is in."""
        context_tokens = self.summary_tokens + sum(m.cost for m in self.since)
        return {
            "last_seq": self.size,
            "message_count": self.size,
            "user_message_count": self.roles["user"],
            "assistant_message_count": self.roles["assistant"],
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "context_tokens": context_tokens,
            "compaction_count": len(self.compactions),
            "last_active_at": self.last_at,
            "updated_at": self.last_at,
            "transcript_ref": transcript_segments_prefix(self.ref),
            "topic_summary": "Planning the vendor contract renewal and the quarterly report.",
            "topics": ["vendor contract", "quarterly report", "migration"],
        }

    def recent_thread(self) -> str:
        """A thread with messages since the last compaction (else the latest one at all)."""
        recent = [m.thread_id for m in self.since if m.thread_id]
        if recent:
            return recent[-1]
        threads = [thread for thread in self.channel_messages if thread]
        return threads[-1] if threads else ""


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


async def load_session(
    database: Database,
    user_id: str,
    size: int,
    *,
    ordinal: int,
    policy: CompactionPolicy,
    texts: TextSource,
    now: datetime,
    last_question: str = "",
) -> LoadedSession:
    """Create a session of `size` messages, ending now, with its compactions and counters.

    `ordinal` makes its thread ids unique in the database; `last_question` is appended to its
    last user message (the query of the turn's recall search).
    """
    started = time.perf_counter()
    start = now - MESSAGE_INTERVAL * (size + 10)
    async with database.session() as db:
        session = await SessionRepository(db).create(user_id, ORG_ID, at=start)
    planner = TranscriptPlanner(
        SessionRef(ORG_ID, user_id, session.id),
        size,
        ordinal=ordinal,
        policy=policy,
        texts=texts,
        start=start,
        last_question=last_question,
    )
    await insert_batches(database, SessionMessage.__table__, planner.messages())
    await insert_batches(database, SessionCompaction.__table__, planner.compactions)
    await insert_batches(database, SessionChannel.__table__, planner.channel_rows())
    async with database.session() as db:
        await db.execute(update(Session).where(Session.id == session.id).values(planner.counters()))
    return LoadedSession(
        session_id=session.id,
        messages=size,
        compactions=len(planner.compactions),
        since_last_compaction=len(planner.since),
        thread_id=planner.recent_thread(),
        load_s=time.perf_counter() - started,
    )


class Ordinals:
    """Numbers for the sessions of the database, so that their thread ids never collide."""

    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        """The next number."""
        self.last += 1
        return self.last


async def load_organization(database: Database, texts: TextSource) -> None:
    """The organization every user belongs to."""
    async with database.session() as db:
        await OrganizationRepository(db).upsert(ORG_ID, "Acme Corp", context=texts.text(300, 600))


async def load_user(
    database: Database,
    user_id: str,
    *,
    ordinals: Ordinals,
    policy: CompactionPolicy,
    texts: TextSource,
    now: datetime,
) -> None:
    """A user with their memory facts and archived sessions with summaries."""
    async with database.session() as db:
        await UserRepository(db).upsert(user_id, ORG_ID, f"Bench {user_id}")
    archived: list[str] = []
    for number in range(ARCHIVED_SESSIONS):
        ended = now - timedelta(days=1 + 2 * number)
        loaded = await load_session(
            database,
            user_id,
            ARCHIVED_SESSION_MESSAGES,
            ordinal=ordinals.next(),
            policy=policy,
            texts=texts,
            now=ended,
        )
        archived.append(loaded.session_id)
        async with database.session() as db:
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
    async with database.session() as db:
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
                at=now - timedelta(hours=MEMORY_FACTS - number),
            )


def history_rows(
    user_id: str, turns: int, texts: TextSource, *, ended: datetime
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]]:
    """Archived sessions of `HISTORY_SESSION_TURNS` turns, one a day up to `ended`: each
    session's row, its messages and its summary. One turn in `RARE_EVERY` mentions the client
    the current session asks about."""
    sessions = math.ceil(turns / HISTORY_SESSION_TURNS)
    for number in range(sessions):
        first = number * HISTORY_SESSION_TURNS
        size = min(HISTORY_SESSION_TURNS, turns - first)
        day = ended - timedelta(days=sessions - number)
        session_id = str(uuid.uuid4())
        session = {
            "id": session_id,
            "user_id": user_id,
            "org_id": ORG_ID,
            "status": SessionStatus.ARCHIVED.value,
            "created_at": day,
            "updated_at": day,
            "last_active_at": day + MESSAGE_INTERVAL * size,
            "current_since": day,
            "archived_at": day + timedelta(hours=4),
            "message_count": size,
            "user_message_count": (size + 1) // 2,
            "assistant_message_count": size // 2,
            "last_seq": size,
            "topic_summary": "Earlier work on the quarterly report and the vendor contract.",
        }
        messages = []
        for index in range(size):
            content = texts.message()
            if (first + index) % RARE_EVERY == RARE_EVERY // 2:
                content = f"{content} {RARE_MENTION}"
            messages.append(
                {
                    "session_id": session_id,
                    "seq": index + 1,
                    "role": "user" if index % 2 == 0 else "assistant",
                    "channel_type": CHANNEL,
                    "thread_id": "",
                    "content": content,
                    "tokens": len(content) // 4,
                    "created_at": day + MESSAGE_INTERVAL * index,
                    "metadata": {},
                }
            )
        summary = {
            "session_id": session_id,
            "user_id": user_id,
            "summary": texts.text(250, 600),
            "topics": ["quarterly report"],
            "message_count": size,
            "created_at": day + timedelta(hours=4),
        }
        yield session, messages, summary


async def load_history(
    database: Database, user_id: str, turns: int, texts: TextSource, *, ended: datetime
) -> float:
    """Insert the user's long history in bulk (about `BATCH_ROWS` messages a statement and
    transaction, with their sessions and summaries); the seconds it took."""
    started = time.perf_counter()
    pending: list[tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]] = []

    async def flush() -> None:
        async with database.session() as db:
            await db.execute(insert(Session.__table__).values([s for s, _, _ in pending]))
            messages = [m for _, ms, _ in pending for m in ms]
            await db.execute(insert(SessionMessage.__table__).values(messages))
            await db.execute(insert(SessionSummary.__table__).values([m for _, _, m in pending]))
        pending.clear()

    for rows in history_rows(user_id, turns, texts, ended=ended):
        pending.append(rows)
        if sum(len(messages) for _, messages, _ in pending) >= BATCH_ROWS:
            await flush()
    if pending:
        await flush()
    return time.perf_counter() - started


# --- measuring ----------------------------------------------------------------------------


@dataclass(slots=True)
class Case:
    """One timed call: a session, outside threads or in one, and its samples."""

    session: LoadedSession
    thread_id: str
    seconds: list[float] = field(default_factory=list)
    messages_sent: int = 0
    history_tokens: int = 0
    rows_read: int = 0

    async def call(self, engine: SessionEngine) -> float:
        """Assemble the context once; the seconds it took."""
        started = time.perf_counter()
        context, rows_read = await engine.assemble_context(self.session.session_id, self.thread_id)
        elapsed = time.perf_counter() - started
        self.messages_sent = len(context.request.messages)
        self.history_tokens = context.history_tokens
        self.rows_read = rows_read
        return elapsed

    def figures(self) -> dict[str, Any]:
        """p50/p95 (nearest rank), mean, and what the assembled request held."""
        ordered = sorted(self.seconds)

        def rank_ms(q: float) -> float:
            return round(ordered[max(math.ceil(q * len(ordered)) - 1, 0)] * 1000, 3)

        return {
            "p50_ms": rank_ms(0.50),
            "p95_ms": rank_ms(0.95),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
            "messages_sent": self.messages_sent,
            "history_tokens": self.history_tokens,
            "rows_read": self.rows_read,
        }


async def measure(engine: SessionEngine, cases: Sequence[Case], *, runs: int, warmup: int) -> None:
    """Warm up, then `runs` rounds calling every case once (interleaved)."""
    for _ in range(warmup):
        for case in cases:
            await case.call(engine)
    for number in range(runs):
        for case in cases:
            case.seconds.append(await case.call(engine))
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
        config = GatewayConfig()
        engine = open_engine(
            config, database, LocalTranscriptStore(workdir / "transcripts"), OfflineLLM(), utcnow
        )
        policy = engine.settings.compaction
        texts = TextSource(SEED)
        now = utcnow()
        ordinals = Ordinals()
        await load_organization(database, texts)
        sized: dict[int, LoadedSession] = {}
        for size in settings.sizes:
            user_id = f"u-size-{size}"
            async with database.session() as db:
                await UserRepository(db).upsert(user_id, ORG_ID, f"Bench {user_id}")
            loaded = await load_session(
                database,
                user_id,
                size,
                ordinal=ordinals.next(),
                policy=policy,
                texts=texts,
                now=now,
            )
            # Written after the session's messages, as a gateway writes them (ids follow time).
            await load_user(
                database, user_id, ordinals=ordinals, policy=policy, texts=texts, now=now
            )
            progress(
                f"  loaded {size} messages, {loaded.compactions} compactions "
                f"in {loaded.load_s:.1f}s"
            )
            sized[size] = loaded
        history: LoadedSession | None = None
        history_load_s = 0.0
        if settings.history_turns:
            # In the order a gateway writes them: the long history first (it ends a week ago),
            # then the user's three recent archived sessions, then the current session.
            async with database.session() as db:
                await UserRepository(db).upsert(HISTORY_USER, ORG_ID, f"Bench {HISTORY_USER}")
            history_load_s = await load_history(
                database,
                HISTORY_USER,
                settings.history_turns,
                texts,
                ended=now - timedelta(days=2 * ARCHIVED_SESSIONS + 1),
            )
            await load_user(
                database, HISTORY_USER, ordinals=ordinals, policy=policy, texts=texts, now=now
            )
            history = await load_session(
                database,
                HISTORY_USER,
                CURRENT_SESSION_MESSAGES,
                ordinal=ordinals.next(),
                policy=policy,
                texts=texts,
                now=now,
                last_question=RARE_QUESTION,
            )
            progress(
                f"  loaded {settings.history_turns} history turns in {history_load_s:.1f}s "
                f"and a session of {CURRENT_SESSION_MESSAGES} messages"
            )
        if analyze:
            async with database.engine.begin() as conn:
                await conn.execute(text("ANALYZE"))
        indexed = {size: await indexed_entries(database, f"u-size-{size}") for size in sized}
        cases = {size: (Case(s, ""), Case(s, s.thread_id)) for size, s in sized.items()}
        history_cases = (Case(history, ""), Case(history, history.thread_id)) if history else ()
        every_case = [case for pair in cases.values() for case in pair] + list(history_cases)
        progress(f"  timing: {settings.warmup} warm-up and {settings.runs} measured rounds")
        await measure(engine, every_case, runs=settings.runs, warmup=settings.warmup)
        history_indexed = await indexed_entries(database, HISTORY_USER) if history else 0
    finally:
        await database.dispose()
    result: dict[str, Any] = {"analyzed": analyze, "sizes": {}}
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
            "indexed_entries": history_indexed,
            "current_session_messages": CURRENT_SESSION_MESSAGES,
            "load_s": round(history_load_s, 2),
            "thread": threaded.figures(),
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


# --- command line -------------------------------------------------------------------------


def parse_settings(argv: Sequence[str] | None) -> BenchSettings:
    """The command line."""
    parser = argparse.ArgumentParser(
        description="Context-assembly time for sessions of growing length, SQLite and PostgreSQL."
    )
    parser.add_argument(
        "--sizes",
        default=",".join(str(size) for size in DEFAULT_SIZES),
        help="session lengths in messages, comma-separated (100,10000,100000; '' for none)",
    )
    parser.add_argument(
        "--history-turns",
        type=int,
        default=DEFAULT_HISTORY_TURNS,
        help=f"indexed turns of the user with a long history ({DEFAULT_HISTORY_TURNS}; 0: none)",
    )
    parser.add_argument("--runs", type=int, default=50, help="measured calls per case (50)")
    parser.add_argument("--warmup", type=int, default=5, help="uncounted calls per case first (5)")
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help="sqlite and/or postgres (both)"
    )
    parser.add_argument(
        "--database-url",
        default=DEFAULT_ADMIN_URL,
        help=f"PostgreSQL admin URL ({DEFAULT_ADMIN_URL})",
    )
    args = parser.parse_args(argv)
    try:
        sizes = tuple(sorted({int(size) for size in args.sizes.split(",") if size.strip()}))
    except ValueError:
        parser.error(f"--sizes {args.sizes}: expected numbers separated by commas")
    if sizes and min(sizes) < 2:
        parser.error("--sizes: session lengths are 2 messages or more")
    if args.history_turns < 0:
        parser.error("--history-turns must be 0 or more")
    if not sizes and not args.history_turns:
        parser.error("nothing to measure: give --sizes or --history-turns")
    backends = tuple(name.strip() for name in args.backends.split(",") if name.strip())
    unknown = set(backends) - set(BACKENDS)
    if not backends or unknown:
        parser.error(f"--backends: choose from {', '.join(BACKENDS)}")
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be positive and --warmup >= 0")
    return BenchSettings(
        sizes=sizes,
        history_turns=args.history_turns,
        runs=args.runs,
        warmup=args.warmup,
        backends=backends,
        admin_url=args.database_url,
    )


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
