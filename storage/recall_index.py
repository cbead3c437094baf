"""The recall index: full-text search over one user's turns and summaries, ranked by BM25.

The rows (`recall_entries`) are written by database triggers (migration 0002); this module
only reads them, and rebuilds them on request (`gateway recall reindex`). Each backend ranks
with what it has:

- SQLite: FTS5 with porter stemming; `bm25()` over the whole FTS table (collection statistics
  are shared by all users; only the user's rows are returned).
- PostgreSQL: the english text-search configuration (Snowball stemming, stopwords) and a GIN
  index. PostgreSQL has no BM25, so it is computed here per user: the number of documents and
  their average length come from `recall_stats` (kept by triggers), document frequencies are
  counted on the GIN index at query time, capped at `DF_CAP` so that a very common word costs
  a bounded amount of work. Candidates are the entries containing a selective word (one below
  the cap); common words still add to their scores. Term frequency is taken as 1 (chat turns
  rarely repeat a word); the length is the number of distinct lexemes.

Terms come in already tokenised and without stopwords (`sessions.recall` does that, the same
way for both backends); each backend stems them the way its index did.
"""

from __future__ import annotations

import json
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
DF_CAP = 1000
"""Document frequencies are counted up to this many entries (PostgreSQL); a word found in
more entries than that is treated as common: it scores, but does not select candidates."""
MAX_CANDIDATES = 5_000
"""Upper bound on the entries scored for one query (PostgreSQL)."""

Ranking = Literal["bm25", "ts_rank"]


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


_ENTRY_COLUMNS = (
    "e.id, e.session_id, e.kind, e.source_id, e.seq, e.speaker, e.channel_type, "
    "e.occurred_at, e.body"
)

_SQLITE_SEARCH = f"""
SELECT {_ENTRY_COLUMNS}, -bm25(recall_fts, 0.0, 0.0, 1.0) AS score
FROM recall_fts JOIN recall_entries e ON e.id = recall_fts.rowid
WHERE recall_fts MATCH :match AND e.user_id = :user_id AND e.kind IN :kinds
  AND e.occurred_at >= :since AND e.occurred_at < :until
ORDER BY score DESC, e.id
LIMIT :limit
"""  # noqa: S608

# Lexemes of the query, each as a one-word tsquery (quoted, so no character of a lexeme can
# be read as tsquery syntax).
_PG_QUERY_LEXEMES = """
q AS (
    SELECT DISTINCT lexeme,
           ('''' || replace(replace(lexeme, '\\', '\\\\'), '''', '''''') || '''')::tsquery AS tq
    FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, :query))) AS lexeme
)"""

_PG_BM25_SEARCH = f"""
WITH {_PG_QUERY_LEXEMES},
st AS (
    SELECT coalesce(sum(documents), 0)::float8 AS n,
           coalesce(sum(total_length)::float8 / nullif(sum(documents), 0), 1.0) AS avgdl
    FROM recall_stats WHERE user_id = :user_id AND kind IN (__KINDS__)
),
df AS MATERIALIZED (
    SELECT q.tq, (SELECT count(*) FROM (
                SELECT 1 FROM recall_entries e
                WHERE e.user_id = :user_id AND e.kind IN (__KINDS__) AND e.tsv @@ q.tq
                LIMIT :cap) AS found)::float8 AS df
    FROM q
),
w AS MATERIALIZED (
    SELECT df.tq, df.df < :cap AS selective,
           ln(1 + (greatest(st.n, df.df) - df.df + 0.5) / (df.df + 0.5)) AS idf
    FROM df, st WHERE df.df > 0
),
sel AS MATERIALIZED (
    SELECT coalesce(string_agg(w.tq::text, ' | ') FILTER (WHERE w.selective),
                    string_agg(w.tq::text, ' | '))::tsquery AS tq
    FROM w
),
c AS MATERIALIZED (
    SELECT e.id, e.tsv, length(e.tsv)::float8 AS dl
    FROM recall_entries e, sel
    WHERE e.user_id = :user_id AND e.kind IN (__KINDS__) AND e.tsv @@ sel.tq
      AND e.occurred_at >= :since AND e.occurred_at < :until
    LIMIT :max_candidates
),
scored AS (
    SELECT c.id, sum(w.idf * (:k1 + 1) / (1 + :k1 * (1 - :b + :b * c.dl / st.avgdl))) AS score
    FROM c JOIN w ON c.tsv @@ w.tq CROSS JOIN st
    GROUP BY c.id
    ORDER BY score DESC, c.id
    LIMIT :limit
)
SELECT {_ENTRY_COLUMNS}, scored.score
FROM scored JOIN recall_entries e ON e.id = scored.id
ORDER BY scored.score DESC, e.id
"""  # noqa: S608

# PostgreSQL's own ranking, kept to measure BM25 against (`bench/recall_locomo.py`).
_PG_TS_RANK_SEARCH = f"""
WITH {_PG_QUERY_LEXEMES},
sel AS (SELECT string_agg(q.tq::text, ' | ')::tsquery AS tq FROM q)
SELECT {_ENTRY_COLUMNS}, ts_rank(e.tsv, sel.tq)::float8 AS score
FROM recall_entries e, sel
WHERE e.user_id = :user_id AND e.kind IN (__KINDS__) AND e.tsv @@ sel.tq
  AND e.occurred_at >= :since AND e.occurred_at < :until
ORDER BY score DESC, e.id
LIMIT :limit
"""  # noqa: S608

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
    "postgresql": f"""
SELECT {_ENTRY_COLUMNS}
FROM json_to_recordset(CAST(:windows AS json)) AS w(session_id text, low int, high int)
JOIN recall_entries e ON e.session_id = w.session_id AND e.seq BETWEEN w.low AND w.high
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


def _tokens_of(value: str) -> bool:
    return any(character.isalnum() for character in value)


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
    ) -> list[IndexedText]:
        """The user's entries of these kinds that contain any of `terms`, best first.

        `since`/`until` bound the time the text was written (`until` excluded). Only the
        user's own entries are ever returned.
        """
        terms = [term for term in terms if _tokens_of(term)]
        if not terms or not kinds or limit < 1:
            return []
        params: dict[str, Any] = {
            "user_id": user_id,
            "limit": limit,
            "since": since or _FAR_PAST,
            "until": until or _FAR_FUTURE,
        }
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise StorageError(f"unknown recall entry kinds: {sorted(unknown)}")
        if self.dialect == "sqlite":
            if ranking != "bm25":
                raise StorageError(f"ranking {ranking!r} is only available on PostgreSQL")
            match = "body : (" + " OR ".join(_fts_string(term) for term in terms) + ")"
            if _tokens_of(user_id):
                match = f"user_id : {_fts_string(user_id)} AND {match}"
            statement = text(_SQLITE_SEARCH).bindparams(
                bindparam("kinds", expanding=True),
                bindparam("since", type_=UTCDateTime()),
                bindparam("until", type_=UTCDateTime()),
            )
            params.update(match=match, kinds=list(kinds))
        else:
            # The kinds are written into the SQL (they are our own constants): each collection
            # gets a statement of its own, planned for its size.
            sql = _PG_BM25_SEARCH if ranking == "bm25" else _PG_TS_RANK_SEARCH
            sql = sql.replace("__KINDS__", ", ".join(f"'{kind}'" for kind in sorted(set(kinds))))
            statement = text(sql).bindparams(
                bindparam("since", type_=UTCDateTime()),
                bindparam("until", type_=UTCDateTime()),
            )
            params.update(
                query=" ".join(terms),
                cap=DF_CAP,
                max_candidates=MAX_CANDIDATES,
                k1=K1,
                b=B,
            )
        typed = statement.columns(occurred_at=UTCDateTime())
        try:
            if self.dialect == "postgresql":
                # A prepared statement's generic plan would be one plan for every user and
                # query; how selective the words are decides the right plan.
                await self.session.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))
            result = await self.session.execute(typed, params)
        except SQLAlchemyError as exc:
            raise StorageError(f"recall search failed: {exc.__class__.__name__}") from exc
        return [_indexed(row, float(row.score)) for row in result]

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
        return [_indexed(row, 0.0) for row in result]

    async def count(self, user_id: str | None = None) -> int:
        """How many entries the index holds (for one user, or all)."""
        statement = select(func.count()).select_from(RecallEntry)
        if user_id is not None:
            statement = statement.where(RecallEntry.user_id == user_id)
        return int((await self.session.execute(statement)).scalar_one())

    async def rebuild(self) -> int:
        """Empty the index and index every stored turn and summary again; the entry count.

        Also repairs whatever went out of step (a trigger dropped by hand, a restored backup):
        on SQLite the FTS table is rebuilt from the entries, on PostgreSQL the statistics
        are recounted.
        """
        await self.session.execute(delete(RecallEntry))
        if self.dialect == "postgresql":
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


def _indexed(row: Any, score: float) -> IndexedText:
    return IndexedText(
        entry_id=row.id,
        session_id=row.session_id,
        kind=row.kind,
        source_id=row.source_id,
        seq=row.seq,
        speaker=row.speaker,
        channel_type=row.channel_type,
        occurred_at=row.occurred_at,
        body=row.body,
        score=score,
    )
