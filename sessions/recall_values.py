"""The values of recall: the bounds of one search (automatic or thorough), the options an admin
sets, what a search leaves out, what it asks the index for, and the hits it returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sessions.recall_query import MAX_QUERY_TERMS
from storage.recall_entries import COMPACTION, SUMMARY, IndexedText, Ranking, SearchBound
from storage.recall_index import RecallIndexReads

HitKind = Literal["turn", "summary"]


@dataclass(frozen=True, slots=True)
class RecallBounds:
    """What one search may examine of the user's turns and of their summaries. Summaries are
    about one per session, so their window and rare-word threshold are a tenth of the turns'."""

    turns: SearchBound
    summaries: SearchBound


AUTOMATIC = RecallBounds(
    turns=SearchBound(
        window=500,
        rare_postings=200,
        max_terms=8,
        considered_terms=MAX_QUERY_TERMS,
        vector_window=10_000,
    ),
    summaries=SearchBound(
        window=50,
        rare_postings=20,
        max_terms=8,
        considered_terms=MAX_QUERY_TERMS,
        vector_window=2_000,
    ),
)
"""The automatic search of every turn: the 500 most recent turns (and 50 summaries), the
whole history for words in at most 200 turns (20 summaries), the 8 rarest words of the
message (see `SearchBound`), and under dense recall the vectors of the 10,000 most recent
turns (2,000 summaries). Sized by what a turn may spend (`bench/context.py`): on PostgreSQL
the search costs a few milliseconds of the database's time whatever the history, and the
turns' vector product 1.3-1.5 CPU-ms (memory-bound: 10 MB read; 20,000 turns cost 2.8-3 ms
of a core beside the database, and the assembly of a user with 100,000 turns 1.2 ms more at
the median). Months of conversation; an older passage is still found by its rare words, or
by the tool's search (`THOROUGH`)."""


THOROUGH = RecallBounds(
    turns=SearchBound(
        window=10_000,
        rare_postings=1_000,
        max_terms=MAX_QUERY_TERMS,
        considered_terms=MAX_QUERY_TERMS,
        vector_window=200_000,
    ),
    summaries=SearchBound(
        window=1_000,
        rare_postings=100,
        max_terms=MAX_QUERY_TERMS,
        considered_terms=MAX_QUERY_TERMS,
        vector_window=20_000,
    ),
)
"""The search the model asks for: twenty times the window, five times the rare words'
postings, every word of the query; still bounded."""


@dataclass(frozen=True, slots=True)
class RecallHit:
    """One thing found: a turn (`message_id` is its `session_messages` row) or a summary."""

    session_id: str
    message_id: int | None
    seq: int | None
    date: datetime
    speaker: str
    text: str
    score: float
    kind: HitKind
    channel: str = ""

    def as_json(self) -> dict[str, Any]:
        """The hit as a JSON object (CLI output)."""
        return {
            "session_id": self.session_id,
            "message_id": self.message_id,
            "seq": self.seq,
            "date": self.date.isoformat(),
            "speaker": self.speaker,
            "kind": self.kind,
            "channel": self.channel,
            "score": round(self.score, 4),
            "text": self.text,
        }


@dataclass(frozen=True, slots=True)
class RecallOptions:
    """Ranking parameters; the defaults are the best measured on the LoCoMo dev split."""

    candidates: int = 200
    neighbour_sources: int = 50
    neighbour_weight: float = 0.5
    second_neighbour_weight: float = 0.15
    speaker_boost: float = 2.0
    speaker_roles: bool = True
    date_boost: float = 3.0
    when_boost: float = 0.5
    summary_weight: float = 1.0
    ranking: Ranking = "bm25"
    automatic: RecallBounds = AUTOMATIC
    thorough: RecallBounds = THOROUGH
    dense: bool = True
    dense_candidates: int = 100
    dense_weight: float = 0.6
    dense_min_similarity: float = 0.65
    dense_without_names: bool = False
    dense_summaries: bool = True
    rrf_k: int = 60
    fusion: Literal["rrf", "scores"] = "scores"
    second_hop: int = 0
    second_hop_weight: float = 0.3
    word_hop: int = 0
    word_hop_weight: float = 0.3


@dataclass(frozen=True, slots=True)
class RecallExclusions:
    """What is already in the model's context and must not be found again.

    The current session's turns after `after_seq` (the messages since its last compaction)
    and its compaction summaries; the session summaries of `summary_sessions` (shown under
    "Recent conversations").
    """

    session_id: str | None = None
    after_seq: int = 0
    summary_sessions: frozenset[str] = field(default_factory=frozenset)
    # Whether the user had entries of other sessions than `session_id`, as read with the
    # session's state (None: not known; the search looks it up).
    others_indexed: bool | None = None

    def excludes(self, entry: IndexedText) -> bool:
        """Whether the entry is already in context."""
        if entry.kind == SUMMARY:
            return entry.session_id in self.summary_sessions
        if entry.session_id != self.session_id:
            return False
        if entry.kind == COMPACTION:
            return True
        return entry.seq is not None and entry.seq > self.after_seq


@dataclass(frozen=True, slots=True)
class IndexQuery:
    """One search of the index: which kinds, how many, when, how ranked, within what bound."""

    kinds: tuple[str, ...]
    limit: int
    since: datetime | None
    until: datetime | None
    ranking: Ranking
    bound: SearchBound

    async def run(
        self, index: RecallIndexReads, user_id: str, terms: Sequence[str]
    ) -> list[IndexedText]:
        """The entries found, best first."""
        found = await index.search(
            user_id,
            terms,
            kinds=self.kinds,
            limit=self.limit,
            since=self.since,
            until=self.until,
            ranking=self.ranking,
            bound=self.bound,
        )
        return found.entries
