"""The recall index's search on PostgreSQL: its statements (the user's statistics, the bounded
BM25 search, and `ts_rank` for comparison) and the search that runs them.

PostgreSQL uses the english text-search configuration (Snowball stemming, stopwords); the
number of the user's entries containing each lexeme is kept in `recall_stats` by triggers,
so it is exact and read before any posting. Postings are read through a GIN index of each
user's own lexemes per kind (`recall_user_lexemes`), so a word common among other users
(or in the user's turns, when summaries are searched) costs nothing. The length is the
number of distinct lexemes. The price is paid when writing: every new entry updates the
statistics row of each of its lexemes.

An old passage found through a rare word still counts a common word: every candidate is
scored on every searched word. The bound itself is `storage.recall_index`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from storage import driver_rows
from storage.recall_bm25 import SearchedTerm, idf, rarest, recent_entries, run_scored
from storage.recall_entries import ENTRY_COLUMNS, TURN, IndexSearch, Ranking, SearchBound

# The query's lexemes with the number of the user's entries holding each, and the
# collection (term '') with its total length. It also sets, for the search that follows in the
# transaction (one round trip fewer than a SET), custom plans (a prepared statement's generic
# plan would be one plan for every user and query: measured, generic plans of this search and
# of the vectors' reads that follow it made the assembly of users beside a larger one two to
# five times slower, for 0.5-0.8 ms of planning saved) and no sequential scans: the bound
# holds only if every read is an index range (a small or not yet analyzed table would
# otherwise be scanned whole, computing every row's user lexemes).
_STATISTICS = """
WITH q AS (
    SELECT DISTINCT lexeme
    FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, :query))) AS lexeme
)
SELECT q.lexeme AS term, coalesce(sum(s.documents), 0)::float8 AS documents,
       0::float8 AS total_length, '' AS planning
FROM q LEFT JOIN recall_stats s
     ON s.user_id = :user_id AND s.kind IN (__KINDS__) AND s.term = q.lexeme
GROUP BY q.lexeme
UNION ALL
SELECT '', coalesce(sum(documents), 0)::float8, coalesce(sum(total_length), 0)::float8,
       set_config('plan_cache_mode', 'force_custom_plan', true)
       || set_config('enable_seqscan', 'off', true)
FROM recall_stats WHERE user_id = :user_id AND kind IN (__KINDS__) AND term = ''
"""

# Candidates: the window's entries holding any searched lexeme, and every entry holding a rare
# one (read through the user's own lexemes in the GIN index; only when the window is full,
# since otherwise it already holds every entry). Each is scored on every searched lexeme.
# The rare postings are read by the GIN index alone and then kept within the period (OFFSET 0
# keeps the period out of that scan): on a table not analyzed yet (a new database, before
# autovacuum's first pass) the planner would otherwise range-scan (user_id, kind,
# occurred_at) on its last column, every user's entries, and compute each one's lexemes.
# For summaries, strip() makes each tsvector a plain value once (a long summary's is stored
# compressed, and every @@ would decompress it again); @@ on single lexemes needs no positions.
_BM25_SEARCH = """
WITH win AS MATERIALIZED (
    SELECT r.id, __PLAIN__ AS tsv FROM (__RECENT__) AS r
),
rare AS MATERIALIZED (
    SELECT r.id, __PLAIN__ AS tsv FROM (
        SELECT p.id, p.tsv, p.occurred_at FROM recall_entries p
        WHERE recall_user_lexemes(p.user_id, p.kind, p.tsv) && CAST(:rare_keys AS text[])
          AND (SELECT count(*) FROM win) >= :window
        OFFSET 0
    ) AS r
    WHERE r.occurred_at >= :since AND r.occurred_at < :until
),
c AS (
    SELECT win.id, win.tsv FROM win WHERE win.tsv @@ CAST(:any_term AS tsquery)
    UNION ALL
    SELECT rare.id, rare.tsv FROM rare WHERE NOT EXISTS (SELECT 1 FROM win WHERE win.id = rare.id)
),
scored AS (
    SELECT c.id,
           (__WEIGHTS__) * (:k1 + 1) / (1 + :k1 * (1 - :b + :b * length(c.tsv) / :avgdl)) AS score
    FROM c
),
best AS (
    SELECT scored.id, scored.score FROM scored ORDER BY scored.score DESC, scored.id LIMIT :limit
)
SELECT __ENTRY_COLUMNS__, best.score, (SELECT count(*) FROM c) AS examined
FROM best JOIN recall_entries e ON e.id = best.id
WHERE e.user_id = :user_id
ORDER BY best.score DESC, e.id
"""

# PostgreSQL's own ranking, kept to measure BM25 against (`bench/recall_locomo.py`); it reads
# every posting of the query's lexemes, so it is not for the turn path.
_TS_RANK_SEARCH = """
SELECT __ENTRY_COLUMNS__, ts_rank(e.tsv, CAST(:any_term AS tsquery))::float8 AS score,
       0 AS examined
FROM recall_entries e
WHERE recall_user_lexemes(e.user_id, e.kind, e.tsv) && CAST(:all_keys AS text[])
  AND e.occurred_at >= :since AND e.occurred_at < :until
ORDER BY score DESC, e.id
LIMIT :limit
"""


def _tsquery_lexeme(lexeme: str) -> str:
    """A lexeme as a one-word tsquery (quoted, so no character of it is read as syntax)."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _any_term(terms: Sequence[SearchedTerm]) -> str:
    """A tsquery matching an entry that holds any of these lexemes."""
    return " | ".join(_tsquery_lexeme(t.key) for t in terms)


def _user_keys(terms: Sequence[SearchedTerm], kinds: Sequence[str], user_id: str) -> list[str]:
    """The keys of these lexemes of the user's entries of these kinds in the GIN index."""
    return [f"{term.key} {kind} {user_id}" for term in terms for kind in kinds]


async def search_postgresql(
    session: driver_rows.DriverScope,
    terms: Sequence[str],
    *,
    kinds: Sequence[str],
    params: dict[str, Any],
    bound: SearchBound,
    ranking: Ranking,
) -> IndexSearch:
    """The user's entries of `kinds` holding any of `terms`, best first, within `bound`.

    `params` holds the user, the period, the limit and the BM25 constants; `kinds` are our
    own constants, sorted (they are written into the SQL).
    """
    in_kinds = ", ".join(f"'{kind}'" for kind in kinds)
    statistics = await driver_rows.rows(
        session,
        _STATISTICS.replace("__KINDS__", in_kinds),
        {"user_id": params["user_id"], "query": " ".join(terms[: bound.considered_terms])},
    )
    collection, total_length = 0.0, 0.0
    found: list[SearchedTerm] = []
    for term, documents, length, _ in statistics:
        if term == "":
            collection, total_length = documents, length
        else:
            found.append(SearchedTerm(term, documents, documents <= bound.rare_postings))
    searched = rarest(found, bound)
    if not searched:
        return IndexSearch([], 0)
    user_id = params["user_id"]
    if ranking == "ts_rank":
        params.update(any_term=_any_term(searched), all_keys=_user_keys(searched, kinds, user_id))
        sql = _TS_RANK_SEARCH.replace("__ENTRY_COLUMNS__", ENTRY_COLUMNS)
    else:
        sql, more = bm25_statement(
            searched, kinds, user_id, bound, collection=collection, total_length=total_length
        )
        params.update(more)
    return await run_scored(session, sql, params)


def bm25_statement(
    searched: Sequence[SearchedTerm],
    kinds: Sequence[str],
    user_id: str,
    bound: SearchBound,
    *,
    collection: float,
    total_length: float,
) -> tuple[str, dict[str, Any]]:
    """The BM25 search of `searched` among the user's entries of `kinds` (our own constants,
    sorted), and its parameters beside those `search_postgresql` is given (the user, the
    period, the limit, the BM25 constants)."""
    params: dict[str, Any] = {"any_term": _any_term(searched), "window": bound.window}
    weights: list[str] = []
    for n, term in enumerate(searched):
        params[f"term_{n}"] = _tsquery_lexeme(term.key)
        params[f"weight_{n}"] = idf(term.documents, max(collection, term.documents))
        weights.append(f"(c.tsv @@ CAST(:term_{n} AS tsquery))::int * :weight_{n}")
    params["rare_keys"] = _user_keys([t for t in searched if t.rare], kinds, user_id)
    params["avgdl"] = total_length / collection if collection and total_length else 1.0
    # A turn's tsvector is small and stored as is; a summary's may be compressed.
    plain = "r.tsv" if list(kinds) == [TURN] else "strip(r.tsv)"
    sql = (
        _BM25_SEARCH.replace("__RECENT__", recent_entries(kinds, extra=", e.tsv"))
        .replace("__WEIGHTS__", " + ".join(weights))
        .replace("__PLAIN__", plain)
        .replace("__ENTRY_COLUMNS__", ENTRY_COLUMNS)
        .replace("__KINDS__", ", ".join(f"'{kind}'" for kind in kinds))
    )
    return sql, params
