"""Resuming by reference: whether a message clearly continues one earlier session, judged by
how many of its words that session's summary holds (`session_referenced`; used for
`recall.resume_by_reference`).
"""

from __future__ import annotations

from collections.abc import Collection

from sessions.recall import RecallSearch
from sessions.recall_query import query_terms, words
from sessions.recall_values import HitKind

# A message "clearly continues" an archived session when it shares at least this many words,
# and this share of its searched words, with that session's summary.
REFERENCE_MIN_TERMS = 3
REFERENCE_MIN_COVERAGE = 0.5


def _stem(word: str) -> str:
    # A crude stem, enough to match "anvils" with "anvil" and "deciding" with "decided".
    return word[:6] if len(word) > 6 else word.rstrip("s")


def reference_coverage(text: str, summary: str) -> tuple[int, float]:
    """(words of `text` found in `summary`, their share of the searched words of `text`)."""
    wanted = {_stem(term) for term in query_terms(text)}
    if not wanted:
        return 0, 0.0
    present = {_stem(term) for term in words(summary)}
    found = len(wanted & present)
    return found, found / len(wanted)


async def session_referenced(
    search: RecallSearch, user_id: str, text: str, *, candidates: Collection[str] | None = None
) -> str | None:
    """The one session whose summary `text` clearly continues, or None.

    Only summaries are compared (a session's summary says what it was about); the best one
    must share `REFERENCE_MIN_TERMS` words and `REFERENCE_MIN_COVERAGE` of the text's words,
    and no other session's summary may match as well, or the reference is ambiguous.
    `candidates`, when given, limits the answer to those session ids (e.g. archived ones).
    """
    summaries: tuple[HitKind, ...] = ("summary",)
    hits = await search.search(user_id, text, 5, kinds=summaries)
    scored: dict[str, tuple[int, float]] = {}
    for hit in hits:
        if hit.kind != "summary" or (candidates is not None and hit.session_id not in candidates):
            continue
        found, coverage = reference_coverage(text, hit.text)
        best = scored.get(hit.session_id, (0, 0.0))
        scored[hit.session_id] = max(best, (found, coverage))
    strong = [
        session_id
        for session_id, (found, coverage) in scored.items()
        if found >= REFERENCE_MIN_TERMS and coverage >= REFERENCE_MIN_COVERAGE
    ]
    return strong[0] if len(strong) == 1 else None
