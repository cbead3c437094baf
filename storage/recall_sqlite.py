"""The recall index's search on SQLite: its FTS5 statements (the window's word counts, a rare
word's latest postings, the bounded BM25 search) and the search that runs them.

SQLite indexes with FTS5 and porter stemming. SQLite cannot stem in a trigger, so the
rareness of a word is estimated from its count in the window's id range (scaled to the user's
number of entries) and made exact for the words the window shows as rare, by reading their
most recent `rare_postings + 1` postings (FTS5 stops there). The length is counted in
characters. One FTS5 index holds every user's entries, so a word is read in the window's id
range, and every word read costs FTS5 a walk through each of its segments. That makes a SQLite
search several times dearer than a PostgreSQL one (`bench/context.py`), still independent of
the length of the history.

Other users' entries in the window's id range (what they wrote while the user was away, on a
database the user shares) are not the user's: when they are most of the range
(`CROWDED_RANGE`), a turn window's words are looked up among the user's own postings (FTS5
steps from one of the user's entries to the next), so the search costs the user's window, not
what everyone wrote meanwhile, and other users' use of a word does not make it look common
(which would leave the user's own rare mentions of it unsearched). When the user wrote most of
the range, reading every posting in it is cheaper than stepping through theirs.

A common word's occurrences are counted within the window and in the old passages found
through rare words that those weigh most in (`OLD_PASSAGES_SCORED`, each looked up by its id:
PostgreSQL scores every candidate on every word). The bound itself is
`storage.recall_index`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from storage import driver_rows
from storage.recall_bm25 import (
    SearchedTerm,
    has_tokens,
    idf,
    rarest,
    recent_entries,
    run_scored,
)
from storage.recall_entries import ENTRY_COLUMNS, TURN, IndexSearch, SearchBound

# The window: its size and id range.
_WINDOW = """
win AS (SELECT r.id FROM (__RECENT__) AS r),
w AS MATERIALIZED (
    SELECT count(*) AS size, coalesce(min(id), 0) AS low, coalesce(max(id), 0) AS high FROM win
)"""

_KNOWN_WINDOW = "w(low, high) AS (SELECT :low, :high)"

# The window's size and id range, the collection's statistics, and each considered word's
# count in the window's id range (entries are indexed as they are written, so ids follow time).
# Turns need no other condition; for summaries, whose window spans many turns, `kind` in the
# FTS query keeps the turns' postings of the word out. Counting only estimates how rare a word
# is, so other users' entries written in between count too (and are read: on a database
# shared by many active users, the window costs what they wrote meanwhile).
_COUNTS = """
WITH __WINDOW__
SELECT w.size, w.low, w.high,
       (SELECT coalesce(sum(documents), 0) FROM recall_stats
        WHERE user_id = :user_id AND kind IN (__KINDS__) AND term = '') AS documents,
       (SELECT coalesce(sum(total_length), 0) FROM recall_stats
        WHERE user_id = :user_id AND kind IN (__KINDS__) AND term = '') AS total_length
       __COUNTS__
FROM w
"""
CROWDED_RANGE = 2
"""A turn window's id range holding more than this many entries for each of the user's is
searched among the user's own postings (see the module docstring)."""

OLD_PASSAGES_SCORED = 30
"""Of the passages found through rare words outside the window, how many (those the rare words
weigh most in, then the latest) are also scored on the common words: each costs a lookup a
common word (about 0.01 ms)."""

FEW_IN_WINDOW = 2
"""A word seen in at most this many of a full window's entries has its postings of the whole
history read (at most `rare_postings + 1`), however large the history: the window's sightings
are too few to tell how rare it is."""

_IN_WINDOW = "recall_fts MATCH :match_{n} AND recall_fts.rowid BETWEEN w.low AND w.high"
_IN_WINDOW_COUNT = (
    ", (SELECT count(*) FROM recall_fts WHERE " + _IN_WINDOW + ") AS count_{n}"  # noqa: S608
)
# The same count, among the user's own postings when the range is crowded.
_CROWDED = f"w.high - w.low + 1 > {CROWDED_RANGE} * w.size"
_IN_TURN_WINDOW_COUNT = _IN_WINDOW_COUNT.replace(
    "MATCH :match_{n}", f"MATCH (CASE WHEN {_CROWDED} THEN :user_match_{{n}} ELSE :match_{{n}} END)"
)
_IN_WINDOW_HITS = (
    "SELECT recall_fts.rowid AS id, :weight_{n} AS weight FROM recall_fts, w WHERE "  # noqa: S608
    + _IN_WINDOW
)
# A rare word's most recent postings of the whole history, newest first (FTS5 stops after
# :cap); this one names the user, since it reads beyond the window.
_LATEST = (
    "SELECT {n} AS term, latest.rowid AS id FROM (SELECT recall_fts.rowid FROM recall_fts "
    "WHERE recall_fts MATCH :user_match_{n} ORDER BY recall_fts.rowid DESC LIMIT :cap) AS latest"
)
# An old passage found through a rare word, looked up by its id under a common word (the
# word's query in the window).
_OLD_PASSAGE_HITS = (
    "SELECT recall_fts.rowid AS id, :weight_{n} AS weight FROM recall_fts "
    "WHERE recall_fts MATCH :match_{n} AND recall_fts.rowid IN (SELECT value FROM json_each(:old))"
)
_LISTED_HITS = (
    "SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS weight "
    "FROM json_each(:listed)"
)
# Scoring: the hits in the window's id range that are the user's entries of these kinds in the
# period (the join keeps them), and the rare words' listed postings.
_BM25_SEARCH = """
WITH __WINDOW__,
hit(id, weight) AS (__HITS__),
weighted AS (SELECT hit.id, sum(hit.weight) AS weight FROM hit GROUP BY hit.id),
scored AS (
    SELECT __ENTRY_COLUMNS__,
           weighted.weight * (:k1 + 1)
           / (1 + :k1 * (1 - :b + :b * length(e.body) / :avgdl)) AS score
    FROM weighted CROSS JOIN recall_entries e ON e.id = weighted.id
    WHERE e.user_id = :user_id AND e.kind IN (__KINDS__)
      AND e.occurred_at >= :since AND e.occurred_at < :until
)
SELECT scored.*, (SELECT count(*) FROM scored) AS examined
FROM scored ORDER BY scored.score DESC, scored.id LIMIT :limit
"""


def _fts_string(value: str) -> str:
    """A string literal of the FTS5 query language."""
    return '"' + value.replace('"', '""') + '"'


def _match(user_id: str, kinds: Sequence[str], term: str) -> str:
    """The FTS5 query for one word: of one user's entries of these kinds when `user_id`
    is given; in the window, of these kinds when they are not just turns (see above). No
    `kinds`: of any kind (the search keeps the kinds it wants when it reads the entries)."""
    match = f"body : {_fts_string(term)}"
    if kinds and (list(kinds) != [TURN] or user_id):
        match = "kind : (" + " OR ".join(_fts_string(k) for k in kinds) + f") AND {match}"
    if has_tokens(user_id):
        match = f"user_id : {_fts_string(user_id)} AND {match}"
    return match


@dataclass(frozen=True, slots=True)
class _Window:
    """What the window's statement found: its size and id range, the user's collection
    (entries and their total length), each considered word's count in the range, and the
    FTS5 query that looks each word up there (among the user's own postings when crowded)."""

    size: int
    low: int
    high: int
    documents: float
    total_length: float
    counts: Sequence[int]
    matches: Mapping[int, str]


async def _window(
    session: driver_rows.DriverScope,
    considered: Sequence[str],
    *,
    kinds: Sequence[str],
    params: Mapping[str, Any],
    bound: SearchBound,
) -> _Window:
    """The window, the collection's statistics and each considered word's count in the
    window's id range, in one statement."""
    matches = {n: _match("", kinds, term) for n, term in enumerate(considered)}
    params = (
        {key: params[key] for key in ("user_id", "since", "until")}
        | {"window": bound.window}
        | {f"match_{n}": match for n, match in matches.items()}
    )
    # Turns only: a crowded window is searched among the user's own postings (a user id
    # FTS5 cannot tokenize names nothing to look up).
    user_id = params["user_id"]
    by_user = list(kinds) == [TURN] and has_tokens(user_id)
    own = {n: _match(user_id, (), term) for n, term in enumerate(considered)} if by_user else {}
    params |= {f"user_match_{n}": match for n, match in own.items()}
    count = _IN_TURN_WINDOW_COUNT if by_user else _IN_WINDOW_COUNT
    sql = (
        _COUNTS.replace("__WINDOW__", _WINDOW.replace("__RECENT__", recent_entries(kinds)))
        .replace("__COUNTS__", "".join(count.format(n=n) for n in matches))
        .replace("__KINDS__", ", ".join(f"'{kind}'" for kind in kinds))
    )
    ((size, low, high, documents, total_length, *counts),) = await driver_rows.rows(
        session, sql, params
    )
    crowded = by_user and high - low + 1 > CROWDED_RANGE * size
    return _Window(
        size, low, high, float(documents), float(total_length), counts, own if crowded else matches
    )


async def _latest_postings(
    session: driver_rows.DriverScope,
    terms: Sequence[str],
    to_look_up: Sequence[SearchedTerm],
    *,
    user_id: str,
    kinds: Sequence[str],
    bound: SearchBound,
) -> dict[str, list[int]]:
    """The most recent `rare_postings + 1` postings of the whole history of each of these
    words (keyed by their position in `terms`), newest first."""
    postings: dict[str, list[int]] = {t.key: [] for t in to_look_up}
    if not to_look_up:
        return postings
    rows = await driver_rows.rows(
        session,
        " UNION ALL ".join(_LATEST.format(n=t.key) for t in to_look_up),
        {"cap": bound.rare_postings + 1}
        | {f"user_match_{t.key}": _match(user_id, kinds, terms[int(t.key)]) for t in to_look_up},
    )
    for term_key, entry_id in rows:
        postings[str(term_key)].append(int(entry_id))
    return postings


def _old_passages(listed: Sequence[tuple[int, float]], window: _Window) -> list[int]:
    """The passages found through rare words outside the window (the window's hits count
    the common words of those inside it), at most `OLD_PASSAGES_SCORED`: those the rare words
    weigh most in, then the latest."""
    weight: dict[int, float] = {}
    for entry_id, rare_weight in listed:
        if not window.low <= entry_id <= window.high:
            weight[entry_id] = weight.get(entry_id, 0.0) + rare_weight
    ranked = sorted(weight, key=lambda entry_id: (-weight[entry_id], -entry_id))
    return ranked[:OLD_PASSAGES_SCORED]


async def search_sqlite(
    session: driver_rows.DriverScope,
    terms: Sequence[str],
    *,
    kinds: Sequence[str],
    params: dict[str, Any],
    bound: SearchBound,
) -> IndexSearch:
    """The user's entries of `kinds` holding any of `terms`, best first, within `bound`.

    `params` holds the user, the period, the limit and the BM25 constants; `kinds` are our
    own constants, sorted (they are written into the SQL).
    """
    considered = terms[: bound.considered_terms]
    window = await _window(session, considered, kinds=kinds, params=params, bound=bound)
    if window.size == 0:
        return IndexSearch([], 0)
    collection = max(window.documents, float(window.size))
    full = window.size >= bound.window
    # The window's share of the collection stands for the whole: a word in 3 of the
    # 1,000 most recent entries of 100,000 is taken to be in about 300.
    # A word seen only once or twice (`FEW_IN_WINDOW`) is a candidate whatever the scale: in
    # a window of 500 of 100,000 entries, one sighting (the question itself, in the current
    # session) would stand for 200 entries, and the user's rare mentions of the word would
    # go unsearched.
    scale = collection / window.size
    estimated = []
    for n in range(len(considered)):
        seen = window.counts[n]
        documents = seen * scale
        if full or documents > 0:
            rare = full and (documents <= bound.rare_postings or seen <= FEW_IN_WINDOW)
            estimated.append(SearchedTerm(str(n), documents, rare))
    # Words the window shows as rare (or not at all): their most recent postings of the
    # whole history, at most `rare_postings + 1`, make their count exact (or show that
    # they are common after all). Only the rarest `max_terms` are looked up.
    ranked = sorted(estimated, key=lambda t: (t.documents, int(t.key)))
    postings = await _latest_postings(
        session,
        terms,
        [t for t in ranked[: bound.max_terms] if t.rare],
        user_id=params["user_id"],
        kinds=kinds,
        bound=bound,
    )
    exact: list[SearchedTerm] = []
    for term in estimated:
        found = postings.get(term.key)
        if found is None:
            # Not looked up: a common word (or a rare one past the `max_terms` rarest),
            # searched in the window only.
            exact.append(SearchedTerm(term.key, max(term.documents, 1.0), rare=False))
        elif len(found) <= bound.rare_postings:
            exact.append(SearchedTerm(term.key, float(len(found)), rare=True))
        else:
            exact.append(SearchedTerm(term.key, max(term.documents, float(len(found))), rare=False))
    searched = rarest(exact, bound)
    if not searched:
        return IndexSearch([], 0)
    hits: list[str] = []
    listed: list[tuple[int, float]] = []
    for term in searched:
        weight = idf(term.documents, max(collection, term.documents))
        if term.rare:
            listed += [(entry_id, weight) for entry_id in postings[term.key]]
        else:
            hits.append(_IN_WINDOW_HITS.format(n=term.key))
            params[f"match_{term.key}"] = window.matches[int(term.key)]
            params[f"weight_{term.key}"] = weight
    if listed:
        hits.append(_LISTED_HITS)
        params["listed"] = json.dumps(listed)
        old = _old_passages(listed, window)
        common = [term for term in searched if not term.rare]
        if old and common:
            # As on PostgreSQL, an old passage found through a rare word also counts the
            # common words it holds: else the recent turns, which share many of them with the
            # message, outrank the passage that answers.
            params["old"] = json.dumps(old)
            hits += [_OLD_PASSAGE_HITS.format(n=term.key) for term in common]
    # The window's id range as the counts found it: the search does not read it again.
    params.update(low=window.low, high=window.high)
    params["avgdl"] = (
        window.total_length / window.documents if window.documents and window.total_length else 1.0
    )
    sql = (
        _BM25_SEARCH.replace("__WINDOW__", _KNOWN_WINDOW)
        .replace("__HITS__", " UNION ALL ".join(hits))
        .replace("__ENTRY_COLUMNS__", ENTRY_COLUMNS)
        .replace("__KINDS__", ", ".join(f"'{kind}'" for kind in kinds))
    )
    return await run_scored(session, sql, params)
