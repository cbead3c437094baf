"""The recall index: full-text search over one user's turns and summaries, ranked by BM25.

The rows (`recall_entries`) are written by database triggers (migrations 0002 and 0003);
this module only reads them, and rebuilds them on request (`gateway recall reindex`).

A search is bounded by the user's recent history, not by all of it (`SearchBound`), because
the automatic search runs on every turn and a user's history only grows:

1. The window: the user's `window` most recent entries of the searched kinds (within
   `since`/`until`), one backward range scan of (user_id, kind, occurred_at) per kind. Every
   searched word is looked up there.
2. Rare words: a word the user has used in at most `rare_postings` entries is also looked up
   in the whole history, so an unusual name or number said a year ago is still found. Its
   postings are read directly, and there are at most `rare_postings` of them.
3. Of the query's first `considered_terms` words, the `max_terms` rarest are searched: a
   common word adds little to a BM25 score and costs the most to look up. Words the user has
   never used cost nothing further; a query left without words finds nothing at once.

So one search scores at most `window + max_terms * rare_postings` entries (`examined`),
whatever the length of the history. A common word's older occurrences are not looked up (an
old passage found through a rare word still counts it on PostgreSQL, which scores every
candidate on every word; SQLite counts it within the window only). A history no longer than
the window is searched completely.

Scores are BM25 with the user's own statistics (`recall_stats`: number of entries and their
total length per user and kind), a term frequency of 1 (chat turns rarely repeat a word) and
the entry's length. Each backend knows how rare a word is in its own way:

- PostgreSQL: the english text-search configuration (Snowball stemming, stopwords); the
  number of the user's entries containing each lexeme is kept in `recall_stats` by triggers,
  so it is exact and read before any posting. Postings are read through a GIN index of each
  user's own lexemes per kind (`recall_user_lexemes`), so a word common among other users
  (or in the user's turns, when summaries are searched) costs nothing. The length is the
  number of distinct lexemes. The price is paid when writing: every new entry updates the
  statistics row of each of its lexemes.
- SQLite: FTS5 with porter stemming. SQLite cannot stem in a trigger, so the rareness of a
  word is estimated from its count in the window's id range (scaled to the user's number of
  entries) and made exact for the words the window shows as rare, by reading their most
  recent `rare_postings + 1` postings (FTS5 stops there). The length is counted in
  characters. One FTS5 index holds every user's entries, so a word is read in the window's id
  range: what other users wrote meanwhile is read too, and every word read costs FTS5 a walk
  through each of its segments. That makes a SQLite search several times dearer than a
  PostgreSQL one (`bench/context.py`), still independent of the length of the history.

Terms come in already tokenised and without stopwords (`sessions.recall` does that, the same
way for both backends); each backend stems them the way its index did.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import bindparam, delete, func, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage.models import RecallEntry, UTCDateTime

TURN = "turn"
SUMMARY = "summary"
COMPACTION = "compaction"
KINDS = (TURN, SUMMARY, COMPACTION)

K1 = 1.2
B = 0.75

Ranking = Literal["bm25", "ts_rank"]


@dataclass(frozen=True, slots=True)
class SearchBound:
    """How much of a user's index one search may examine (see the module docstring): the
    `window` most recent entries, the whole history for words in at most `rare_postings`
    entries, the rarest `max_terms` of the query's first `considered_terms` words.

    The defaults are those of the automatic search of every turn over turns
    (`sessions.recall.AUTOMATIC`).
    """

    window: int = 500
    rare_postings: int = 200
    max_terms: int = 8
    considered_terms: int = 32

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


@dataclass(frozen=True, slots=True)
class IndexedText:
    """An entry of the index as a search returns it, with its score (higher is better)."""

    entry_id: int
    session_id: str
    kind: str
    source_id: int
    seq: int | None
    speaker: str
    channel_type: str
    occurred_at: datetime
    body: str
    score: float


@dataclass(frozen=True, slots=True)
class IndexSearch:
    """What one search found, best first, and how many entries it scored to find it."""

    entries: list[IndexedText]
    examined: int


@dataclass(frozen=True, slots=True)
class _Term:
    """A searched word as a backend knows it: its form in the index, how many of the user's
    entries hold it (exact, or estimated on SQLite), and whether its postings are looked up in
    the whole history (`rare`)."""

    key: str
    documents: float
    rare: bool


_ENTRY_COLUMNS = (
    "e.id, e.session_id, e.kind, e.source_id, e.seq, e.speaker, e.channel_type, "
    "e.occurred_at, e.body"
)

# The user's most recent entries of the searched kinds in the period: one LIMITed backward
# range scan of (user_id, kind, occurred_at) per kind (__KIND__ is one of our constants).
_RECENT_OF_KIND = """
    SELECT * FROM (
        SELECT e.id, e.occurred_at{extra} FROM recall_entries e
        WHERE e.user_id = :user_id AND e.kind = '__KIND__'
          AND e.occurred_at >= :since AND e.occurred_at < :until
        ORDER BY e.occurred_at DESC LIMIT :window
    ) AS recent_{n}"""


def _recent(kinds: Sequence[str], extra: str = "") -> str:
    """The window as a subquery: the `:window` most recent entries over all `kinds`."""
    parts = [
        _RECENT_OF_KIND.replace("__KIND__", kind).format(extra=extra, n=n)
        for n, kind in enumerate(kinds)
    ]
    union = " UNION ALL ".join(parts)
    return f"SELECT * FROM ({union}) AS recent ORDER BY occurred_at DESC, id DESC LIMIT :window"  # noqa: S608


# --- PostgreSQL ---------------------------------------------------------------------------

# The query's lexemes with the number of the user's entries holding each, and the
# collection (term '') with its total length. It also sets, for the search that follows in the
# transaction (one round trip fewer than a SET), custom plans (a prepared statement's generic
# plan would be one plan for every user and query) and no sequential scans: the bound holds
# only if every read is an index range (a small or not yet analyzed table would otherwise be
# scanned whole, computing every row's user lexemes).
_PG_STATISTICS = """
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
# For summaries, strip() makes each tsvector a plain value once (a long summary's is stored
# compressed, and every @@ would decompress it again); @@ on single lexemes needs no positions.
_PG_BM25_SEARCH = """
WITH win AS MATERIALIZED (
    SELECT r.id, __PLAIN__ AS tsv FROM (__RECENT__) AS r
),
rare AS MATERIALIZED (
    SELECT r.id, __PLAIN__ AS tsv FROM recall_entries r
    WHERE recall_user_lexemes(r.user_id, r.kind, r.tsv) && CAST(:rare_keys AS text[])
      AND r.occurred_at >= :since AND r.occurred_at < :until
      AND (SELECT count(*) FROM win) >= :window
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
_PG_TS_RANK_SEARCH = """
SELECT __ENTRY_COLUMNS__, ts_rank(e.tsv, CAST(:any_term AS tsquery))::float8 AS score,
       0 AS examined
FROM recall_entries e
WHERE recall_user_lexemes(e.user_id, e.kind, e.tsv) && CAST(:all_keys AS text[])
  AND e.occurred_at >= :since AND e.occurred_at < :until
ORDER BY score DESC, e.id
LIMIT :limit
"""

# --- SQLite -------------------------------------------------------------------------------

# The window: its size and id range.
_SQLITE_WINDOW = """
win AS (SELECT r.id FROM (__RECENT__) AS r),
w AS MATERIALIZED (
    SELECT count(*) AS size, coalesce(min(id), 0) AS low, coalesce(max(id), 0) AS high FROM win
)"""

# The window's size and id range, the collection's statistics, and each considered word's
# count in the window's id range (entries are indexed as they are written, so ids follow time).
# Turns need no other condition; for summaries, whose window spans many turns, `kind` in the
# FTS query keeps the turns' postings of the word out. Counting only estimates how rare a word
# is, so other users' entries written in between count too (and are read: on a database
# shared by many active users, the window costs what they wrote meanwhile).
_SQLITE_COUNTS = """
WITH __WINDOW__
SELECT w.size, w.low, w.high,
       (SELECT coalesce(sum(documents), 0) FROM recall_stats
        WHERE user_id = :user_id AND kind IN (__KINDS__) AND term = '') AS documents,
       (SELECT coalesce(sum(total_length), 0) FROM recall_stats
        WHERE user_id = :user_id AND kind IN (__KINDS__) AND term = '') AS total_length
       __COUNTS__
FROM w
"""
_SQLITE_IN_WINDOW = "recall_fts MATCH :match_{n} AND recall_fts.rowid BETWEEN w.low AND w.high"
_SQLITE_IN_WINDOW_COUNT = (
    ", (SELECT count(*) FROM recall_fts WHERE " + _SQLITE_IN_WINDOW + ") AS count_{n}"  # noqa: S608
)
_SQLITE_IN_WINDOW_HITS = (
    "SELECT recall_fts.rowid AS id, :weight_{n} AS weight FROM recall_fts, w WHERE "  # noqa: S608
    + _SQLITE_IN_WINDOW
)
# A rare word's most recent postings of the whole history, newest first (FTS5 stops after
# :cap); this one names the user, since it reads beyond the window.
_SQLITE_LATEST = (
    "SELECT {n} AS term, latest.rowid AS id FROM (SELECT recall_fts.rowid FROM recall_fts "
    "WHERE recall_fts MATCH :user_match_{n} ORDER BY recall_fts.rowid DESC LIMIT :cap) AS latest"
)
_SQLITE_LISTED_HITS = (
    "SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS weight "
    "FROM json_each(:listed)"
)
# Scoring: the hits in the window's id range that are the user's entries of these kinds in the
# period (the join keeps them), and the rare words' listed postings.
_SQLITE_BM25_SEARCH = """
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

# Turns near given positions: the windows come as one JSON parameter (a fixed statement, so
# it is compiled and planned once), each window one index range scan of (session_id, seq).
_TURNS_AROUND = {
    "sqlite": f"""
SELECT {_ENTRY_COLUMNS}
FROM json_each(:windows) AS w
JOIN recall_entries e ON e.session_id = json_extract(w.value, '$.session_id')
     AND e.seq BETWEEN json_extract(w.value, '$.low') AND json_extract(w.value, '$.high')
WHERE e.user_id = :user_id AND e.kind = 'turn'
ORDER BY e.session_id, e.seq
""",  # noqa: S608
    # One index range scan of (session_id, seq) per window (LATERAL, kept apart by OFFSET 0,
    # the user and kind checked outside it): the planner cannot know how few rows the windows
    # hold, and would rather hash-join the session's turns or read all the user's.
    "postgresql": f"""
SELECT {_ENTRY_COLUMNS}
FROM json_to_recordset(CAST(:windows AS json)) AS w(session_id text, low int, high int)
CROSS JOIN LATERAL (
    SELECT * FROM recall_entries n
    WHERE n.session_id = w.session_id AND n.seq BETWEEN w.low AND w.high
    OFFSET 0
) AS e
WHERE e.user_id = :user_id AND e.kind = 'turn'
ORDER BY e.session_id, e.seq
""",  # noqa: S608
}

# Rebuilding: the same rows the triggers of migration 0002 write, for every source row.
_SPEAKER = {
    "sqlite": (
        "substr(coalesce(nullif(trim(CASE WHEN json_valid(m.metadata) "
        "THEN json_extract(m.metadata, '$.speaker') END), ''), {fallback}), 1, 200)"
    ),
    "postgresql": "left(coalesce(nullif(btrim(m.metadata ->> 'speaker'), ''), {fallback}), 200)",
}
_SPEAKER_FALLBACK = (
    "CASE WHEN m.role = 'user' THEN coalesce(nullif(u.display_name, ''), u.id) ELSE 'assistant' END"
)
_REBUILD = (
    """INSERT INTO recall_entries
        (user_id, session_id, kind, source_id, seq, speaker, channel_type, occurred_at, body)
    SELECT s.user_id, m.session_id, 'turn', m.id, m.seq, {speaker}, m.channel_type,
           m.created_at, m.content
    FROM session_messages m JOIN sessions s ON s.id = m.session_id
         JOIN users u ON u.id = s.user_id
    WHERE m.role IN ('user', 'assistant') AND trim(m.content) <> ''""",
    """INSERT INTO recall_entries
        (user_id, session_id, kind, source_id, seq, speaker, channel_type, occurred_at, body)
    SELECT m.user_id, m.session_id, 'summary', m.id, NULL, '', '', m.created_at, m.summary
    FROM session_summaries m WHERE trim(m.summary) <> ''""",
    """INSERT INTO recall_entries
        (user_id, session_id, kind, source_id, seq, speaker, channel_type, occurred_at, body)
    SELECT s.user_id, m.session_id, 'compaction', m.id, m.last_message_seq, '', '',
           m.created_at, m.summary
    FROM session_compactions m JOIN sessions s ON s.id = m.session_id
    WHERE trim(m.summary) <> ''""",
)

_FAR_PAST = datetime(1970, 1, 1, tzinfo=UTC)
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)


def _fts_string(value: str) -> str:
    """A string literal of the FTS5 query language."""
    return '"' + value.replace('"', '""') + '"'


def _tsquery_lexeme(lexeme: str) -> str:
    """A lexeme as a one-word tsquery (quoted, so no character of it is read as syntax)."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _tokens_of(value: str) -> bool:
    return any(character.isalnum() for character in value)


def _idf(documents: float, collection: float) -> float:
    return math.log(1 + (collection - documents + 0.5) / (documents + 0.5))


def _user_keys(terms: Sequence[_Term], kinds: Sequence[str], user_id: str) -> list[str]:
    """The keys of these lexemes of the user's entries of these kinds in the GIN index."""
    return [f"{term.key} {kind} {user_id}" for term in terms for kind in kinds]


def _rarest(terms: Sequence[_Term], bound: SearchBound) -> list[_Term]:
    """The words to search: those the user has used, the rarest first, at most `max_terms`."""
    used = sorted((t for t in terms if t.documents > 0), key=lambda t: (t.documents, t.key))
    return used[: bound.max_terms]


class RecallIndexRepository:
    """Searches of the recall index, and its rebuild, within one `AsyncSession`."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session
        self.dialect = session.get_bind().dialect.name

    async def search(
        self,
        user_id: str,
        terms: Sequence[str],
        *,
        kinds: Sequence[str] = KINDS,
        limit: int = 50,
        since: datetime | None = None,
        until: datetime | None = None,
        ranking: Ranking = "bm25",
        bound: SearchBound | None = None,
    ) -> IndexSearch:
        """The user's entries of these kinds that contain any of `terms`, best first, looked
        up within `bound` (the default `SearchBound()`; see the module docstring).

        `since`/`until` bound the time the text was written (`until` excluded). Only the
        user's own entries are ever returned.
        """
        terms = [term for term in terms if _tokens_of(term)]
        if not terms or not kinds or limit < 1:
            return IndexSearch([], 0)
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise StorageError(f"unknown recall entry kinds: {sorted(unknown)}")
        if ranking != "bm25" and self.dialect == "sqlite":
            raise StorageError(f"ranking {ranking!r} is only available on PostgreSQL")
        params: dict[str, Any] = {
            "user_id": user_id,
            "limit": limit,
            "since": since or _FAR_PAST,
            "until": until or _FAR_FUTURE,
            "k1": K1,
            "b": B,
        }
        # The kinds are written into the SQL (they are our own constants): each collection
        # gets a statement of its own, planned for its size.
        ordered_kinds = sorted(set(kinds))
        try:
            if self.dialect == "sqlite":
                return await self._search_sqlite(
                    terms, ordered_kinds, params, bound or SearchBound()
                )
            return await self._search_postgresql(
                terms, ordered_kinds, params, bound or SearchBound(), ranking
            )
        except SQLAlchemyError as exc:
            raise StorageError(f"recall search failed: {exc.__class__.__name__}") from exc

    async def _search_postgresql(
        self,
        terms: Sequence[str],
        kinds: Sequence[str],
        params: dict[str, Any],
        bound: SearchBound,
        ranking: Ranking,
    ) -> IndexSearch:
        in_kinds = ", ".join(f"'{kind}'" for kind in kinds)
        statistics = await self.session.execute(
            text(_PG_STATISTICS.replace("__KINDS__", in_kinds)),
            {"user_id": params["user_id"], "query": " ".join(terms[: bound.considered_terms])},
        )
        collection, total_length = 0.0, 0.0
        found: list[_Term] = []
        for row in statistics:
            if row.term == "":
                collection, total_length = row.documents, row.total_length
            else:
                documents = float(row.documents)
                found.append(_Term(row.term, documents, documents <= bound.rare_postings))
        searched = _rarest(found, bound)
        if not searched:
            return IndexSearch([], 0)
        user_id = params["user_id"]
        params.update(
            any_term=" | ".join(_tsquery_lexeme(t.key) for t in searched),
            window=bound.window,
        )
        if ranking == "ts_rank":
            params["all_keys"] = _user_keys(searched, kinds, user_id)
            sql = _PG_TS_RANK_SEARCH
        else:
            weights: list[str] = []
            for n, term in enumerate(searched):
                params[f"term_{n}"] = _tsquery_lexeme(term.key)
                params[f"weight_{n}"] = _idf(term.documents, max(collection, term.documents))
                weights.append(f"(c.tsv @@ CAST(:term_{n} AS tsquery))::int * :weight_{n}")
            params["rare_keys"] = _user_keys([t for t in searched if t.rare], kinds, user_id)
            params["avgdl"] = total_length / collection if collection and total_length else 1.0
            # A turn's tsvector is small and stored as is; a summary's may be compressed.
            plain = "r.tsv" if list(kinds) == [TURN] else "strip(r.tsv)"
            sql = (
                _PG_BM25_SEARCH.replace("__RECENT__", _recent(kinds, extra=", e.tsv"))
                .replace("__WEIGHTS__", " + ".join(weights))
                .replace("__PLAIN__", plain)
            )
        sql = sql.replace("__ENTRY_COLUMNS__", _ENTRY_COLUMNS).replace("__KINDS__", in_kinds)
        return await self._scored(sql, params)

    async def _search_sqlite(
        self,
        terms: Sequence[str],
        kinds: Sequence[str],
        params: dict[str, Any],
        bound: SearchBound,
    ) -> IndexSearch:
        in_kinds = ", ".join(f"'{kind}'" for kind in kinds)
        user_id = params["user_id"]
        window_size = bound.window
        window_sql = _SQLITE_WINDOW.replace("__RECENT__", _recent(kinds))
        considered = terms[: bound.considered_terms]
        matches = {n: self._sqlite_match("", kinds, term) for n, term in enumerate(considered)}
        counts_sql = (
            _SQLITE_COUNTS.replace("__WINDOW__", window_sql)
            .replace("__COUNTS__", "".join(_SQLITE_IN_WINDOW_COUNT.format(n=n) for n in matches))
            .replace("__KINDS__", in_kinds)
        )
        window_params = {key: params[key] for key in ("user_id", "since", "until")} | {
            "window": window_size
        }
        counted = (
            await self.session.execute(
                self._with_period(counts_sql),
                window_params | {f"match_{n}": match for n, match in matches.items()},
            )
        ).one()
        if counted.size == 0:
            return IndexSearch([], 0)
        collection = max(float(counted.documents), float(counted.size))
        full = counted.size >= window_size
        # The window's share of the collection stands for the whole: a word in 3 of the
        # 1,000 most recent entries of 100,000 is taken to be in about 300.
        scale = collection / counted.size
        estimated = []
        for n in matches:
            documents = getattr(counted, f"count_{n}") * scale
            if full or documents > 0:
                estimated.append(
                    _Term(str(n), documents, full and documents <= bound.rare_postings)
                )
        # Words the window shows as rare (or not at all): their most recent postings of the
        # whole history, at most `rare_postings + 1`, make their count exact (or show that
        # they are common after all). Only the rarest `max_terms` are looked up.
        ranked = sorted(estimated, key=lambda t: (t.documents, int(t.key)))
        to_look_up = [t for t in ranked[: bound.max_terms] if t.rare]
        postings: dict[str, list[int]] = {t.key: [] for t in to_look_up}
        if to_look_up:
            latest = " UNION ALL ".join(_SQLITE_LATEST.format(n=t.key) for t in to_look_up)
            rows = await self.session.execute(
                text(latest),
                {"cap": bound.rare_postings + 1}
                | {
                    f"user_match_{t.key}": self._sqlite_match(user_id, kinds, terms[int(t.key)])
                    for t in to_look_up
                },
            )
            for row in rows:
                postings[str(row.term)].append(int(row.id))
        exact: list[_Term] = []
        for term in estimated:
            found = postings.get(term.key)
            if found is None:
                # Not looked up: a common word (or a rare one past the `max_terms` rarest),
                # searched in the window only.
                exact.append(_Term(term.key, max(term.documents, 1.0), rare=False))
            elif len(found) <= bound.rare_postings:
                exact.append(_Term(term.key, float(len(found)), rare=True))
            else:
                exact.append(_Term(term.key, max(term.documents, float(len(found))), rare=False))
        searched = _rarest(exact, bound)
        if not searched:
            return IndexSearch([], 0)
        hits: list[str] = []
        listed: list[tuple[int, float]] = []
        for term in searched:
            weight = _idf(term.documents, max(collection, term.documents))
            if term.rare:
                listed += [(entry_id, weight) for entry_id in postings[term.key]]
            else:
                hits.append(_SQLITE_IN_WINDOW_HITS.format(n=term.key))
                params[f"match_{term.key}"] = matches[int(term.key)]
                params[f"weight_{term.key}"] = weight
        if listed:
            hits.append(_SQLITE_LISTED_HITS)
            params["listed"] = json.dumps(listed)
        params["window"] = window_size
        params["avgdl"] = (
            float(counted.total_length) / float(counted.documents)
            if counted.documents and counted.total_length
            else 1.0
        )
        sql = (
            _SQLITE_BM25_SEARCH.replace("__WINDOW__", window_sql)
            .replace("__HITS__", " UNION ALL ".join(hits))
            .replace("__ENTRY_COLUMNS__", _ENTRY_COLUMNS)
            .replace("__KINDS__", in_kinds)
        )
        return await self._scored(sql, params)

    @staticmethod
    def _with_period(sql: str) -> Any:
        """The statement with `since` and `until` bound as aware datetimes."""
        return text(sql).bindparams(
            bindparam("since", type_=UTCDateTime()), bindparam("until", type_=UTCDateTime())
        )

    @staticmethod
    def _sqlite_match(user_id: str, kinds: Sequence[str], term: str) -> str:
        """The FTS5 query for one word: of one user's entries of these kinds when `user_id`
        is given; in the window, of these kinds when they are not just turns (see above)."""
        match = f"body : {_fts_string(term)}"
        if kinds != [TURN] or user_id:
            match = "kind : (" + " OR ".join(_fts_string(k) for k in kinds) + f") AND {match}"
        if _tokens_of(user_id):
            match = f"user_id : {_fts_string(user_id)} AND {match}"
        return match

    async def _scored(self, sql: str, params: dict[str, Any]) -> IndexSearch:
        statement = self._with_period(sql).columns(occurred_at=UTCDateTime())
        rows = [tuple(row) for row in await self.session.execute(statement, params)]
        examined = int(rows[0][10]) if rows else 0
        return IndexSearch([_indexed(row[:9], float(row[9])) for row in rows], examined)

    async def turns_around(
        self, user_id: str, positions: Sequence[tuple[str, int]], *, span: int
    ) -> list[IndexedText]:
        """The user's turns within `span` sequence numbers of each (session id, seq), in
        session and sequence order (score 0)."""
        if not positions:
            return []
        # Overlapping windows merged, then joined as a VALUES list: one index range scan of
        # (session_id, seq) per window.
        windows: list[tuple[str, int, int]] = []
        for session_id, at in sorted(set(positions)):
            if windows and windows[-1][0] == session_id and at - span <= windows[-1][2]:
                windows[-1] = (session_id, windows[-1][1], at + span)
            else:
                windows.append((session_id, at - span, at + span))
        statement = text(_TURNS_AROUND[self.dialect]).columns(occurred_at=UTCDateTime())
        result = await self.session.execute(
            statement,
            {
                "user_id": user_id,
                "windows": json.dumps(
                    [{"session_id": sid, "low": low, "high": high} for sid, low, high in windows]
                ),
            },
        )
        return [_indexed(tuple(row), 0.0) for row in result]

    async def count(self, user_id: str | None = None) -> int:
        """How many entries the index holds (for one user, or all)."""
        statement = select(func.count()).select_from(RecallEntry)
        if user_id is not None:
            statement = statement.where(RecallEntry.user_id == user_id)
        return int((await self.session.execute(statement)).scalar_one())

    async def rebuild(self) -> int:
        """Empty the index and index every stored turn and summary again; the entry count.

        Also repairs whatever went out of step (a trigger dropped by hand, a restored backup):
        the statistics are recounted, and on SQLite the FTS table is rebuilt from the entries.
        """
        await self.session.execute(delete(RecallEntry))
        await self.session.execute(text("DELETE FROM recall_stats"))
        speaker = _SPEAKER[self.dialect].format(fallback=_SPEAKER_FALLBACK)
        if self.dialect == "postgresql":
            statements = [sql.replace("trim(", "btrim(") for sql in _REBUILD]
        else:
            statements = list(_REBUILD)
        for sql in statements:
            await self.session.execute(text(sql.format(speaker=speaker)))
        if self.dialect == "sqlite":
            rebuild_fts = "INSERT INTO recall_fts(recall_fts) VALUES ('rebuild')"
            await self.session.execute(text(rebuild_fts))
        return await self.count()


def _indexed(row: Sequence[Any], score: float) -> IndexedText:
    """An entry from the columns of `_ENTRY_COLUMNS`, in that order (positional: a search
    reads hundreds of rows, and a turn waits for them)."""
    entry_id, session_id, kind, source_id, seq, speaker, channel_type, occurred_at, body = row
    return IndexedText(
        entry_id, session_id, kind, source_id, seq, speaker, channel_type, occurred_at, body, score
    )
