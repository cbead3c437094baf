"""The recall index's search on SQLite: its FTS5 statements (the window's word counts, a rare
word's latest postings, the bounded BM25 search) and the search that runs them.

SQLite indexes with FTS5 and porter stemming. SQLite cannot stem in a trigger, so the
rareness of a word is estimated from its count in the window's id range (scaled to the user's
number of entries) and made exact for the words the window shows as rare, by reading their
most recent `rare_postings + 1` postings (FTS5 stops there). The length is counted in
characters. One FTS5 index holds every user's entries, so a word is read in the window's id
range: what other users wrote meanwhile is read too, and every word read costs FTS5 a walk
through each of its segments. That makes a SQLite search several times dearer than a
PostgreSQL one (`bench/context.py`), still independent of the length of the history.

A common word's occurrences are counted within the window only, even in an old passage
found through a rare word. The bound itself is `storage.recall_index`'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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
_IN_WINDOW = "recall_fts MATCH :match_{n} AND recall_fts.rowid BETWEEN w.low AND w.high"
_IN_WINDOW_COUNT = (
    ", (SELECT count(*) FROM recall_fts WHERE " + _IN_WINDOW + ") AS count_{n}"  # noqa: S608
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
    is given; in the window, of these kinds when they are not just turns (see above)."""
    match = f"body : {_fts_string(term)}"
    if kinds != [TURN] or user_id:
        match = "kind : (" + " OR ".join(_fts_string(k) for k in kinds) + f") AND {match}"
    if has_tokens(user_id):
        match = f"user_id : {_fts_string(user_id)} AND {match}"
    return match


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
    in_kinds = ", ".join(f"'{kind}'" for kind in kinds)
    user_id = params["user_id"]
    window_size = bound.window
    window_sql = _WINDOW.replace("__RECENT__", recent_entries(kinds))
    considered = terms[: bound.considered_terms]
    matches = {n: _match("", kinds, term) for n, term in enumerate(considered)}
    counts_sql = (
        _COUNTS.replace("__WINDOW__", window_sql)
        .replace("__COUNTS__", "".join(_IN_WINDOW_COUNT.format(n=n) for n in matches))
        .replace("__KINDS__", in_kinds)
    )
    window_params = {key: params[key] for key in ("user_id", "since", "until")} | {
        "window": window_size
    }
    ((size, low, high, documents_in_all, total_length, *counts),) = await driver_rows.rows(
        session,
        counts_sql,
        window_params | {f"match_{n}": match for n, match in matches.items()},
    )
    if size == 0:
        return IndexSearch([], 0)
    collection = max(float(documents_in_all), float(size))
    full = size >= window_size
    # The window's share of the collection stands for the whole: a word in 3 of the
    # 1,000 most recent entries of 100,000 is taken to be in about 300.
    scale = collection / size
    estimated = []
    for n in matches:
        documents = counts[n] * scale
        if full or documents > 0:
            estimated.append(
                SearchedTerm(str(n), documents, full and documents <= bound.rare_postings)
            )
    # Words the window shows as rare (or not at all): their most recent postings of the
    # whole history, at most `rare_postings + 1`, make their count exact (or show that
    # they are common after all). Only the rarest `max_terms` are looked up.
    ranked = sorted(estimated, key=lambda t: (t.documents, int(t.key)))
    to_look_up = [t for t in ranked[: bound.max_terms] if t.rare]
    postings: dict[str, list[int]] = {t.key: [] for t in to_look_up}
    if to_look_up:
        latest = " UNION ALL ".join(_LATEST.format(n=t.key) for t in to_look_up)
        rows = await driver_rows.rows(
            session,
            latest,
            {"cap": bound.rare_postings + 1}
            | {
                f"user_match_{t.key}": _match(user_id, kinds, terms[int(t.key)]) for t in to_look_up
            },
        )
        for term_key, entry_id in rows:
            postings[str(term_key)].append(int(entry_id))
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
            params[f"match_{term.key}"] = matches[int(term.key)]
            params[f"weight_{term.key}"] = weight
    if listed:
        hits.append(_LISTED_HITS)
        params["listed"] = json.dumps(listed)
    # The window's id range as the counts found it: the search does not read it again.
    params.update(low=low, high=high)
    params["avgdl"] = (
        float(total_length) / float(documents_in_all) if documents_in_all and total_length else 1.0
    )
    sql = (
        _BM25_SEARCH.replace("__WINDOW__", _KNOWN_WINDOW)
        .replace("__HITS__", " UNION ALL ".join(hits))
        .replace("__ENTRY_COLUMNS__", ENTRY_COLUMNS)
        .replace("__KINDS__", in_kinds)
    )
    return await run_scored(session, sql, params)
