"""Recall quality on LoCoMo: evidence recall@5, @10 and All@10 of `RecallSearch.search`.

It loads a LoCoMo-format file into the project's real storage, through the gateway's own
repositories (so the database triggers index everything as they do in production): each
sample becomes one user, each LoCoMo session a session of that user (archived, with its
`session_summary` as the session summary the gateway's background job would have written),
and each turn a message at the session's date (speaker A is the user, speaker B the assistant;
the speaker's name is kept in the message metadata). Then every question of categories 1-4 is
run through `search(user, question, 10, kinds=("turn",))`, and the dia_ids of the turns found
are scored against the question's evidence as `../shared/bench-data/locomo/README.md`
describes (evidence ids normalised; ids missing from the conversation dropped; questions left
without evidence skipped).

Several ranking configurations are measured on one load (`--configs`; default: all), so the
table shows what each idea adds (with the recall model installed, `default` is the hybrid
search of the gateway and `default-full-text` the same without vectors); `--text` changes
what is stored as the message text (the speaker's name and/or the session date in front of
it), to measure indexing those.

`search` is the automatic search of every turn, bounded (`sessions.recall.AUTOMATIC`: the
500 most recent turns, the whole history for rare words, the 8 rarest words). A LoCoMo
conversation has 300 to 700 turns, so the bound bites only a little; `default-thorough`
measures the bound of the `search_past_conversations` tool (`THOROUGH`, which covers every
conversation whole), and `default-window-100` a window of 100 turns and 10 summaries with
words in more than 20 turns (2 summaries) looked up in the window only: what the bound costs
on a history several times its window.

Run it (PostgreSQL on 127.0.0.1:5432, trust auth):

    .venv/bin/python bench/recall_locomo.py --data ../shared/bench-data/locomo/locomo_dev.json
    .venv/bin/python bench/recall_locomo.py --data PATH --backends sqlite --configs default

One JSON object goes to stdout (per backend and configuration: per category and overall
`n`, `r5`, `r10`, `all10` in %), progress to stderr. Exit code 2 when it could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from benchkit import BenchError, progress, throwaway_database
from sqlalchemy.exc import SQLAlchemyError

from errors import StorageError
from gateway.log import configure_logging
from sessions.lifecycle import transition
from sessions.recall import RecallSearch
from sessions.recall_embedding import load_embedder
from sessions.recall_values import THOROUGH, RecallBounds, RecallOptions
from storage.database import Database
from storage.models import SessionStatus, SessionSummary
from storage.recall_entries import SearchBound
from storage.repositories.sessions import SessionRepository
from storage.repositories.summaries import SummaryRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from storage.vector_index import VectorIndex

EMBEDDER = load_embedder()
"""The installed embedding model (None: the dense configurations measure full text only)."""
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
BACKENDS = ("sqlite", "postgres")
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
ORG_ID = "locomo"
TEXT_VARIANTS = ("plain", "speaker", "date", "speaker+date")

_NONE = RecallOptions(
    neighbour_weight=0.0, second_neighbour_weight=0.0, speaker_boost=0.0, summary_weight=0.0
)
CONFIGS: dict[str, tuple[RecallOptions, bool]] = {
    # name: (options, summaries stored)
    "bm25": (_NONE, False),
    "bm25+neighbours": (replace(_NONE, neighbour_weight=0.5, second_neighbour_weight=0.15), False),
    "bm25+speaker": (replace(_NONE, speaker_boost=2.0), False),
    "bm25+summaries": (replace(_NONE, summary_weight=1.0), True),
    "default-no-summaries": (RecallOptions(summary_weight=0.0), False),
    "default-no-neighbours": (
        RecallOptions(neighbour_weight=0.0, second_neighbour_weight=0.0),
        True,
    ),
    "default-no-speaker": (RecallOptions(speaker_boost=0.0), True),
    "default-any-speaker": (RecallOptions(speaker_roles=False), True),
    "default-no-dates": (RecallOptions(date_boost=0.0), True),
    "default-no-when": (RecallOptions(when_boost=0.0), True),
    "default": (RecallOptions(), True),
    # Dense recall: full text only (the ranking before it), reciprocal-rank fusion instead
    # of score fusion, and the two multi-hop ideas measured (both off by default): a second
    # vector search seeded by the first hits, a second word search for their words.
    "default-full-text": (RecallOptions(dense=False), True),
    "default-rrf": (RecallOptions(fusion="rrf"), True),
    "default-second-hop": (RecallOptions(second_hop=3), True),
    "default-word-hop": (RecallOptions(word_hop=1, word_hop_weight=0.5), True),
    # The turns' vector search asked without the speakers' names (off by default).
    "default-without-names": (RecallOptions(dense_without_names=True), True),
    "default-thorough": (RecallOptions(automatic=THOROUGH), True),
    "default-window-100": (
        RecallOptions(
            automatic=RecallBounds(
                turns=SearchBound(window=100, rare_postings=20),
                summaries=SearchBound(window=10, rare_postings=2),
            )
        ),
        True,
    ),
    # PostgreSQL only: its own ranking instead of BM25.
    "ts_rank": (replace(_NONE, ranking="ts_rank"), False),
    "default-ts_rank": (RecallOptions(ranking="ts_rank"), True),
}


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """The command line, validated."""

    data: Path
    backends: tuple[str, ...]
    configs: tuple[str, ...]
    text: str
    admin_url: str


@dataclass(frozen=True, slots=True)
class Question:
    """A question with its normalised evidence."""

    user_id: str
    text: str
    category: int
    evidence: frozenset[str]


# --- the data -------------------------------------------------------------------------------

_EVIDENCE = re.compile(r"^D:?(\d+):0*(\d+)$")


def normalise_evidence(raw: Sequence[str], known: set[str]) -> frozenset[str]:
    """Evidence ids as the README says: split, `D:11:26` → `D11:26`, unknown ids dropped."""
    found: set[str] = set()
    for item in raw:
        for part in str(item).replace(" ", "").split(";"):
            match = _EVIDENCE.match(part)
            if match:
                dia_id = f"D{int(match[1])}:{int(match[2])}"
                if dia_id in known:
                    found.add(dia_id)
    return frozenset(found)


def session_numbers(conversation: dict[str, Any]) -> list[int]:
    """The numbers of the sessions that have turns, in order."""
    numbers = [
        int(key.removeprefix("session_"))
        for key, value in conversation.items()
        if re.fullmatch(r"session_\d+", key) and isinstance(value, list)
    ]
    return sorted(numbers)


def session_date(text: str) -> datetime:
    """`1:56 pm on 8 May, 2023` as an aware datetime (taken as UTC)."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def turn_text(turn: dict[str, Any], variant: str, when: datetime) -> str:
    """What is stored as the message: the turn's text, its shared image's caption, and (for
    the `--text` variants) the speaker's name and/or the session date in front."""
    text = str(turn["text"])
    if turn.get("blip_caption"):
        text += f" [shares {turn['blip_caption']}]"
    if "speaker" in variant:
        text = f"{turn['speaker']}: {text}"
    if "date" in variant:
        text = f"({when:%d %B %Y}) {text}"
    return text


async def load_sample(
    database: Database, sample: dict[str, Any], variant: str, *, summaries: bool
) -> tuple[dict[int, str], list[Question]]:
    """Store one sample as a user; the message row id → dia_id map and its questions."""
    conversation = sample["conversation"]
    user_id = str(sample["sample_id"])
    user_speaker = conversation["speaker_a"]
    async with database.session() as db:
        await OrganizationRepository(db).upsert(ORG_ID, "LoCoMo")
        await UserRepository(db).upsert(user_id, ORG_ID, user_speaker)
    dia_of: dict[int, str] = {}
    for number in session_numbers(conversation):
        started = session_date(conversation[f"session_{number}_date_time"])
        async with database.session() as db:
            sessions = SessionRepository(db)
            session = await sessions.create(user_id, ORG_ID, at=started)
            for index, turn in enumerate(conversation[f"session_{number}"]):
                at = started + timedelta(seconds=30 * index)
                row = await sessions.append_message(
                    session.id,
                    role="user" if turn["speaker"] == user_speaker else "assistant",
                    channel_type="web",
                    content=turn_text(turn, variant, started),
                    at=at,
                    metadata={"speaker": turn["speaker"], "dia_id": turn["dia_id"]},
                )
                dia_of[row.id] = str(turn["dia_id"])
            ended = started + timedelta(hours=1)
            transition(session, SessionStatus.ARCHIVED, at=ended, reason="benchmark data")
            summary = sample.get("session_summary", {}).get(f"session_{number}_summary")
            if summaries and summary:
                await SummaryRepository(db).add(
                    SessionSummary(
                        session_id=session.id,
                        user_id=user_id,
                        summary=summary,
                        topics=[],
                        message_count=len(conversation[f"session_{number}"]),
                        created_at=ended,
                    )
                )
    known = set(dia_of.values())
    questions = []
    for qa in sample["qa"]:
        category = int(qa.get("category", 0))
        if category not in CATEGORIES:
            continue
        evidence = normalise_evidence(qa.get("evidence", []), known)
        if evidence:
            questions.append(Question(user_id, str(qa["question"]), category, evidence))
    return dia_of, questions


# --- measuring ------------------------------------------------------------------------------


def score(found: Sequence[str], evidence: frozenset[str]) -> tuple[float, float, float]:
    """R@5, R@10 and All@10 of one question."""
    top5, top10 = set(found[:5]), set(found[:10])
    return (
        len(top5 & evidence) / len(evidence),
        len(top10 & evidence) / len(evidence),
        1.0 if evidence <= top10 else 0.0,
    )


def table(rows: list[tuple[int, tuple[float, float, float]]]) -> dict[str, Any]:
    """Per category and overall: n, r5, r10, all10 (in %)."""
    result: dict[str, Any] = {}
    groups = [(f"{c} {name}", [r for cat, r in rows if cat == c]) for c, name in CATEGORIES.items()]
    groups.append(("overall", [r for _, r in rows]))
    for name, values in groups:
        n = len(values)
        result[name] = {
            "n": n,
            **{
                key: round(100 * sum(v[i] for v in values) / n, 1) if n else None
                for i, key in enumerate(("r5", "r10", "all10"))
            },
        }
    return result


async def measure(
    database: Database, questions: list[Question], dia_of: dict[int, str], options: RecallOptions
) -> tuple[dict[str, Any], float]:
    """Run every question; the table and the mean seconds per search."""
    embedder = database.embedder
    vectors = VectorIndex(embedder) if embedder is not None else None
    recall = RecallSearch(database, options, vectors=vectors)
    rows: list[tuple[int, tuple[float, float, float]]] = []
    started = time.perf_counter()
    for question in questions:
        hits = await recall.search(question.user_id, question.text, 10, kinds=("turn",))
        found = [dia_of[hit.message_id] for hit in hits if hit.message_id in dia_of]
        rows.append((question.category, score(found, question.evidence)))
    return table(rows), (time.perf_counter() - started) / max(len(questions), 1)


async def run_backend(url: str, settings: BenchSettings, postgres: bool) -> dict[str, Any]:
    """Load the data (with and without summaries, as the configurations need) and measure."""
    samples = json.loads(settings.data.read_text(encoding="utf-8"))
    result: dict[str, Any] = {}
    wanted = [name for name in settings.configs if postgres or "ts_rank" not in name]
    for with_summaries in (False, True):
        names = [name for name in wanted if CONFIGS[name][1] == with_summaries]
        if not names:
            continue
        suffix = "with" if with_summaries else "without"
        database = Database(url.replace("{summaries}", suffix))
        database.use_embedder(EMBEDDER)
        try:
            await database.upgrade()
            started = time.perf_counter()
            dia_of: dict[int, str] = {}
            questions: list[Question] = []
            for sample in samples:
                ids, asked = await load_sample(
                    database, sample, settings.text, summaries=with_summaries
                )
                dia_of.update(ids)
                questions += asked
            progress(
                f"  loaded {len(dia_of)} turns ({suffix} summaries) in "
                f"{time.perf_counter() - started:.1f}s; {len(questions)} questions"
            )
            for name in names:
                figures, seconds = await measure(database, questions, dia_of, CONFIGS[name][0])
                result[name] = {**figures, "mean_search_ms": round(seconds * 1000, 2)}
                progress(f"  {name}: overall R@10 {figures['overall']['r10']}")
        finally:
            await database.dispose()
    return result


def database_url(admin_url: str, database: str) -> str:
    """The admin URL pointed at `database`, for SQLAlchemy's psycopg driver."""
    parts = urlsplit(admin_url)
    return urlunsplit(parts._replace(scheme="postgresql+psycopg", path=f"/{database}"))


def run_one(backend: str, settings: BenchSettings) -> dict[str, Any]:
    """One backend, in fresh databases made (and removed) for it."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="gateway-bench-recall-") as folder:
            url = f"sqlite+aiosqlite:///{Path(folder) / 'recall-{summaries}.db'}"
            return asyncio.run(run_backend(url, settings, postgres=False))
    with (
        throwaway_database(settings.admin_url) as without,
        throwaway_database(settings.admin_url) as with_,
    ):
        names = {"without": without, "with": with_}

        async def both() -> dict[str, Any]:
            result: dict[str, Any] = {}
            for suffix, name in names.items():
                subset = replace(
                    settings,
                    configs=tuple(
                        c for c in settings.configs if CONFIGS[c][1] == (suffix == "with")
                    ),
                )
                result.update(
                    await run_backend(database_url(settings.admin_url, name), subset, True)
                )
            return result

        return asyncio.run(both())


def parse_settings(argv: Sequence[str] | None) -> BenchSettings:
    """The command line."""
    parser = argparse.ArgumentParser(description="Recall quality on a LoCoMo-format file.")
    parser.add_argument("--data", type=Path, required=True, help="LoCoMo-format JSON file")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="sqlite and/or postgres")
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"any of: {', '.join(CONFIGS)}"
    )
    parser.add_argument(
        "--text", default="plain", choices=TEXT_VARIANTS, help="what a message's text holds"
    )
    parser.add_argument("--database-url", default=DEFAULT_ADMIN_URL, help="PostgreSQL admin URL")
    args = parser.parse_args(argv)
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file")
    backends = tuple(name.strip() for name in args.backends.split(",") if name.strip())
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"--backends: choose from {', '.join(BACKENDS)}")
    configs = tuple(name.strip() for name in args.configs.split(",") if name.strip())
    if not configs or set(configs) - set(CONFIGS):
        parser.error(f"--configs: choose from {', '.join(CONFIGS)}")
    return BenchSettings(args.data, backends, configs, args.text, args.database_url)


def _interrupt_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the throwaway databases are dropped


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    settings = parse_settings(argv)
    configure_logging("console", "warning")  # progress only; the figures go to stdout
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    result: dict[str, Any] = {
        "settings": {"data": str(settings.data), "text": settings.text},
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
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
