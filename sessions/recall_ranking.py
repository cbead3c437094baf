"""The ranking ideas recall adds on top of the index's BM25 scores, as pure functions.

Each takes the candidates' scores (entry id → score) and returns new ones; none reads the
database, so they are tested with plain `IndexedText` values. `sessions.recall.RecallSearch`
reads the candidates and applies them in this order, with the weights of `RecallOptions`:

1. `spread_to_neighbours`: an answer is often the turn after (or before) the one that matches
   the words of the question, so each of the best candidates passes a share of its score to
   the turns next to it.
2. `boost_named_speakers`: when the query names a speaker of the candidate turns ("what did
   Caroline research?"), that speaker's turns are boosted (of several named, those the
   query asks about: `sessions.recall_query.asked_about`).
3. `boost_by_dates`: when the query names a day or a month, the turns written then are
   boosted.
4. `boost_by_summaries`: sessions whose summaries match the query lend their turns a boost in
   proportion to the summary's score.

Before them, with dense recall, `fuse_scores` (or `fuse_ranks`, reciprocal-rank fusion)
merges the full-text and the vector candidates into one ranking, whose scores the four then
work on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime

from sessions.recall_dates import DateSpan
from storage.recall_entries import IndexedText


def spread_to_neighbours(
    scores: Mapping[int, float],
    sources: Sequence[IndexedText],
    around: Sequence[IndexedText],
    since: datetime | None,
    until: datetime | None,
    *,
    neighbour_weight: float,
    second_neighbour_weight: float,
) -> dict[int, float]:
    """Each source turn passes shares of its score to the turns next to it (`neighbour_weight`)
    and two turns away (`second_neighbour_weight`), among the turns of `around` written
    within `since`/`until`."""
    in_range = [
        t
        for t in around
        if (since is None or t.occurred_at >= since) and (until is None or t.occurred_at < until)
    ]
    by_session: dict[str, list[IndexedText]] = defaultdict(list)
    for turn in in_range:
        by_session[turn.session_id].append(turn)
    position: dict[int, tuple[str, int]] = {}
    for session_id, session_turns in by_session.items():
        session_turns.sort(key=lambda t: t.seq or 0)
        for index, turn in enumerate(session_turns):
            position[turn.entry_id] = (session_id, index)
    spread = dict(scores)
    weights = ((1, neighbour_weight), (2, second_neighbour_weight))
    for source in sources:
        if source.entry_id not in position:
            continue
        session_id, index = position[source.entry_id]
        session_turns = by_session[session_id]
        for distance, weight in weights:
            for neighbour in (index - distance, index + distance):
                if weight > 0 and 0 <= neighbour < len(session_turns):
                    entry_id = session_turns[neighbour].entry_id
                    spread[entry_id] = spread.get(entry_id, 0.0) + weight * source.score
    return spread


def boost_named_speakers(
    scores: Mapping[int, float],
    entries: Mapping[int, IndexedText],
    named: Collection[str],
    boost: float,
) -> dict[int, float]:
    """Multiply by `1 + boost` the scores of the turns of the `named` speakers."""
    if boost <= 0 or not named:
        return dict(scores)
    return _boosted(scores, entries, boost, lambda entry: entry.speaker in named)


def boost_by_dates(
    scores: Mapping[int, float],
    entries: Mapping[int, IndexedText],
    spans: Sequence[DateSpan],
    boost: float,
) -> dict[int, float]:
    """Multiply by `1 + boost` the scores of the turns written within a period the query
    names (`sessions.recall_dates.dates_named`)."""
    if boost <= 0 or not spans:
        return dict(scores)
    return _boosted(
        scores, entries, boost, lambda entry: any(span.holds(entry.occurred_at) for span in spans)
    )


def _boosted(
    scores: Mapping[int, float],
    entries: Mapping[int, IndexedText],
    boost: float,
    chosen: Callable[[IndexedText], bool],
) -> dict[int, float]:
    """The scores, those of the `chosen` entries multiplied by `1 + boost`."""
    return {
        entry_id: score * (1 + boost) if chosen(entries[entry_id]) else score
        for entry_id, score in scores.items()
    }


def boost_by_summaries(
    scores: Mapping[int, float],
    entries: Mapping[int, IndexedText],
    summaries: Sequence[IndexedText],
    weight: float,
) -> dict[int, float]:
    """Multiply each turn's score by `1 + weight * s`, where s is the best score of its
    session's matching summaries relative to the best summary found (0 to 1)."""
    if weight <= 0 or not summaries:
        return dict(scores)
    best = max(summary.score for summary in summaries) or 1.0
    prior: dict[str, float] = defaultdict(float)
    for summary in summaries:
        prior[summary.session_id] = max(prior[summary.session_id], summary.score / best)
    return {
        entry_id: score * (1 + weight * prior[entries[entry_id].session_id])
        for entry_id, score in scores.items()
    }


def fuse_ranks(
    rankings: Sequence[tuple[Sequence[IndexedText], float]], k: int
) -> list[IndexedText]:
    """Reciprocal-rank fusion: each entry scores the sum over the rankings that hold it of
    `weight / (k + rank)` (rank from 1); the entries best first, with those scores.

    Ranks, not scores, are added, because BM25's scores and cosine similarities have
    nothing in common but their order."""
    fused: dict[int, float] = defaultdict(float)
    entries: dict[int, IndexedText] = {}
    for ranking, weight in rankings:
        if weight <= 0:
            continue
        for rank, entry in enumerate(ranking, start=1):
            fused[entry.entry_id] += weight / (k + rank)
            entries.setdefault(entry.entry_id, entry)
    ordered = sorted(fused.items(), key=lambda item: -item[1])
    return [entries[entry_id].scored(score) for entry_id, score in ordered]


def fuse_scores(
    rankings: Sequence[tuple[Sequence[IndexedText], float]],
) -> list[IndexedText]:
    """Score fusion: each ranking's scores scaled to 0..1 of its best (its worst candidate
    counting 0), weighted and added; the entries best first, with those scores on the first
    ranking's scale (so that what works on full-text scores keeps its meaning)."""
    fused: dict[int, float] = defaultdict(float)
    entries: dict[int, IndexedText] = {}
    scale = max((e.score for e in rankings[0][0]), default=1.0) if rankings else 1.0
    for ranking, weight in rankings:
        if weight <= 0 or not ranking:
            continue
        best = max(entry.score for entry in ranking)
        worst = min(entry.score for entry in ranking)
        spread = (best - worst) or 1.0
        for entry in ranking:
            fused[entry.entry_id] += weight * (entry.score - worst) / spread
            entries.setdefault(entry.entry_id, entry)
    ordered = sorted(fused.items(), key=lambda item: -item[1])
    return [entries[entry_id].scored(score * scale) for entry_id, score in ordered]
