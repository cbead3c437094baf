"""What the two backends' bounded BM25 searches of the recall index share: the BM25 constants
and IDF, a searched word as a backend knows it (`SearchedTerm`), the choice of the rarest
words, the window subquery (the user's most recent entries), and running a scored statement
into an `IndexSearch`.

Scores are BM25 with the user's own statistics (`recall_stats`: number of entries and their
total length per user and kind), a term frequency of 1 (chat turns rarely repeat a word) and
the entry's length. How rare a word is, and how long an entry, each backend knows in its own
way (`storage.recall_postgresql`, `storage.recall_sqlite`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from storage import driver_rows
from storage.recall_entries import (
    ENTRY_TIMESTAMP,
    ENTRY_WIDTH,
    IndexSearch,
    SearchBound,
    indexed_text,
)

K1 = 1.2
B = 0.75


@dataclass(frozen=True, slots=True)
class SearchedTerm:
    """A searched word as a backend knows it: its form in the index, how many of the user's
    entries hold it (exact, or estimated on SQLite), and whether its postings are looked up in
    the whole history (`rare`)."""

    key: str
    documents: float
    rare: bool


# The user's most recent entries of the searched kinds in the period: one LIMITed backward
# range scan of (user_id, kind, occurred_at) per kind (__KIND__ is one of our constants).
_RECENT_OF_KIND = """
    SELECT * FROM (
        SELECT e.id, e.occurred_at{extra} FROM recall_entries e
        WHERE e.user_id = :user_id AND e.kind = '__KIND__'
          AND e.occurred_at >= :since AND e.occurred_at < :until
        ORDER BY e.occurred_at DESC LIMIT :window
    ) AS recent_{n}"""


def recent_entries(kinds: Sequence[str], extra: str = "") -> str:
    """The window as a subquery: the `:window` most recent entries over all `kinds`."""
    parts = [
        _RECENT_OF_KIND.replace("__KIND__", kind).format(extra=extra, n=n)
        for n, kind in enumerate(kinds)
    ]
    union = " UNION ALL ".join(parts)
    return f"SELECT * FROM ({union}) AS recent ORDER BY occurred_at DESC, id DESC LIMIT :window"  # noqa: S608


def has_tokens(value: str) -> bool:
    """Whether the string holds anything an index would tokenise (a letter or a digit)."""
    return any(character.isalnum() for character in value)


def idf(documents: float, collection: float) -> float:
    """BM25's inverse document frequency of a word in `documents` of `collection` entries."""
    return math.log(1 + (collection - documents + 0.5) / (documents + 0.5))


def rarest(terms: Sequence[SearchedTerm], bound: SearchBound) -> list[SearchedTerm]:
    """The words to search: those the user has used, the rarest first, at most `max_terms`."""
    used = sorted((t for t in terms if t.documents > 0), key=lambda t: (t.documents, t.key))
    return used[: bound.max_terms]


async def run_scored(
    session: driver_rows.DriverScope, sql: str, params: dict[str, Any]
) -> IndexSearch:
    """Run a search statement whose rows are `ENTRY_COLUMNS`, the score and `examined`."""
    rows = await driver_rows.rows(session, sql, params, timestamps=(ENTRY_TIMESTAMP,))
    examined = int(rows[0][ENTRY_WIDTH + 1]) if rows else 0
    return IndexSearch(
        [indexed_text(row[:ENTRY_WIDTH], float(row[ENTRY_WIDTH])) for row in rows], examined
    )
