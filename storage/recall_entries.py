"""The values of the recall index: the kinds of entry it holds, an entry as a search returns it
(`IndexedText`, read from a row's `ENTRY_COLUMNS`), what a search found (`IndexSearch`), what
one search may examine (`SearchBound`) and how it ranks (`Ranking`).

The searches that produce them are `storage.recall_index.RecallIndexRepository`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

TURN = "turn"
SUMMARY = "summary"
COMPACTION = "compaction"
KINDS = (TURN, SUMMARY, COMPACTION)

Ranking = Literal["bm25", "ts_rank"]


@dataclass(frozen=True, slots=True)
class SearchBound:
    """How much of a user's index one search may examine (see `storage.recall_index`): the
    `window` most recent entries, the whole history for words in at most `rare_postings`
    entries, the rarest `max_terms` of the query's first `considered_terms` words; and, for
    dense recall, the vectors of the `vector_window` most recent entries.

    The defaults are those of the automatic search of every turn over turns
    (`sessions.recall.AUTOMATIC`).
    """

    window: int = 500
    rare_postings: int = 200
    max_terms: int = 8
    considered_terms: int = 32
    # Dense recall: the most recent entries whose vectors are scored (all of them: None).
    vector_window: int | None = 10_000

    def __post_init__(self) -> None:
        if (
            min(self.window, self.max_terms) < 1
            or self.rare_postings < 0
            or self.considered_terms < self.max_terms
        ):
            raise ValueError(f"invalid search bound: {self}")

    @property
    def most_examined(self) -> int:
        """The most entries one search may score."""
        return self.window + self.max_terms * self.rare_postings


class IndexedText(NamedTuple):
    """An entry of the index as a search returns it, with its score (higher is better), and
    without its text: a search ranks hundreds of candidates for a few hits, and reads the
    text of those only (`RecallIndexRepository.texts`).

    A named tuple rather than a frozen dataclass: one search builds about a thousand of
    them while a turn waits, and a tuple is built three times faster."""

    entry_id: int
    session_id: str
    kind: str
    source_id: int
    seq: int | None
    speaker: str
    channel_type: str
    occurred_at: datetime
    score: float

    def scored(self, score: float) -> IndexedText:
        """The same entry with another score."""
        return IndexedText(
            self.entry_id,
            self.session_id,
            self.kind,
            self.source_id,
            self.seq,
            self.speaker,
            self.channel_type,
            self.occurred_at,
            score,
        )


@dataclass(frozen=True, slots=True)
class IndexSearch:
    """What one search found, best first, and how many entries it scored to find it."""

    entries: list[IndexedText]
    examined: int


OTHERS_INDEXED = (
    "EXISTS (SELECT 1 FROM sessions other WHERE other.user_id = {user} AND other.id <> {session}"
    " AND EXISTS (SELECT 1 FROM recall_entries r WHERE r.session_id = other.id))"
)
"""Whether a user has a recall entry in another session than one, as SQL for both backends
(`{user}` and `{session}` are SQL expressions): each of the user's other sessions is one
lookup of (session_id, seq), the first with an entry ending it, so it costs at most the
user's number of sessions, never the number of entries of the current one. An entry's user
is its session's (the triggers that write entries take it from the session)."""


ENTRY_COLUMNS = (
    "e.id, e.session_id, e.kind, e.source_id, e.seq, e.speaker, e.channel_type, e.occurred_at"
)
"""The columns of `recall_entries e` an `IndexedText` is read from, in `indexed_text`'s order
(`ENTRY_WIDTH` of them; `occurred_at` at `ENTRY_TIMESTAMP`)."""
ENTRY_WIDTH = len(ENTRY_COLUMNS.split(", "))
ENTRY_TIMESTAMP = ENTRY_COLUMNS.split(", ").index("e.occurred_at")


def indexed_text(row: Sequence[Any], score: float) -> IndexedText:
    """An entry from the columns of `ENTRY_COLUMNS`, in that order."""
    return IndexedText._make((*row, score))
