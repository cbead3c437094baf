"""The recall index: full-text search over one user's turns and summaries, ranked by BM25.

The rows (`recall_entries`) are written by database triggers (migrations 0002 and 0003);
this module owns the reads of a search (`RecallIndexReads`: a bounded search, the turns next
to given positions, the texts of chosen entries, through the driver on any scope, a lent
connection included) and the repository that also rebuilds them on request
(`RecallIndexRepository`, in an ORM session: `gateway recall reindex`).
The values it takes and returns are in `storage.recall_entries`; the search statements are
each backend's (`storage.recall_postgresql`, `storage.recall_sqlite`), on the BM25 scoring
they share (`storage.recall_bm25`).

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
old passage found through a rare word still counts it: PostgreSQL scores every candidate on
every word, SQLite the old passages the rare words weigh most in). A history no longer than
the window is searched completely.

Scores are BM25 with the user's own statistics (`recall_stats`: number of entries and their
total length per user and kind); each backend knows how rare a word is, and how long an
entry, in its own way (see their modules).

Terms come in already tokenised and without stopwords (`sessions.recall_query` does that,
the same way for both backends); each backend stems them the way its index did.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage import driver_rows
from storage.database import Database
from storage.models import RecallEntry
from storage.recall_bm25 import K1, B, has_tokens
from storage.recall_entries import (
    ENTRY_COLUMNS,
    ENTRY_TIMESTAMP,
    KINDS,
    OTHERS_INDEXED,
    IndexedText,
    IndexSearch,
    Ranking,
    SearchBound,
    indexed_text,
)
from storage.recall_postgresql import search_postgresql
from storage.recall_sqlite import search_sqlite

# By primary key only, the user checked on the rows read: with `user_id` in the WHERE clause
# PostgreSQL would rather walk the user's (user, kind, time) index, tens of milliseconds for a
# long history, than look up a few ids. The ids go as one parameter (an array, a JSON list),
# so the statement is the same whatever their number: prepared once, planned once.
_TEXTS = {
    "postgresql": (
        "SELECT e.id, e.user_id, e.body FROM recall_entries e "
        "WHERE e.id = ANY(CAST(:ids AS bigint[]))"
    ),
    "sqlite": (
        "SELECT e.id, e.user_id, e.body FROM recall_entries e "
        "WHERE e.id IN (SELECT value FROM json_each(:ids))"
    ),
}

# The `:per_side` turns before and after each position (by sequence number, whatever lies
# between them unindexed: tool calls and results). Each side is an index range scan of
# (session_id, seq) that stops after `:per_side` rows.
_SQLITE_SIDE = """
    SELECT (SELECT n.id FROM recall_entries n
            WHERE n.session_id = json_extract(w.value, '$.session_id')
              AND n.seq {op} json_extract(w.value, '$.seq') AND n.kind = 'turn'
            ORDER BY n.seq {order} LIMIT 1 OFFSET {offset}) AS id
    FROM json_each(:positions) AS w"""


def _sqlite_neighbours(per_side: int) -> str:
    """SQLite has no LATERAL: each side is `per_side` scalar subqueries, the nth turn before
    or after each position, each an index lookup of (session_id, seq)."""
    sides = [
        _SQLITE_SIDE.format(op=op, order=order, offset=offset)
        for op, order in (("<", "DESC"), (">", "ASC"))
        for offset in range(per_side)
    ]
    # CROSS JOIN keeps the ids the outer loop: each entry read by its primary key (the
    # planner would rather walk the user's turns and test each against the ids).
    return f"""
SELECT {ENTRY_COLUMNS}
FROM ({" UNION ".join(sides)}
) AS near CROSS JOIN recall_entries e ON e.id = near.id
WHERE e.user_id = :user_id AND e.kind = 'turn'
ORDER BY e.session_id, e.seq
"""  # noqa: S608


# LATERAL, the user checked outside it: the planner cannot know how few rows each side holds,
# and would rather hash-join the session's turns or read all the user's. The kind is compared
# with IS NOT DISTINCT FROM, which no index serves: on a table not analyzed yet (a new
# database, before autovacuum's first pass) the planner otherwise ANDs the (session_id, seq)
# range with the (kind, source_id) index, whose 'turn' range holds every user's turns.
_NEIGHBOURS_PG = f"""
SELECT DISTINCT {ENTRY_COLUMNS}
FROM json_to_recordset(CAST(:positions AS json)) AS w(session_id text, seq int)
CROSS JOIN LATERAL (
    (SELECT * FROM recall_entries b
     WHERE b.session_id = w.session_id AND b.seq < w.seq AND b.kind IS NOT DISTINCT FROM 'turn'
     ORDER BY b.seq DESC LIMIT :per_side)
    UNION ALL
    (SELECT * FROM recall_entries a
     WHERE a.session_id = w.session_id AND a.seq > w.seq AND a.kind IS NOT DISTINCT FROM 'turn'
     ORDER BY a.seq LIMIT :per_side)
) AS e
WHERE e.user_id = :user_id
ORDER BY e.session_id, e.seq
"""  # noqa: S608

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

# SQLite: one step of merging the full-text index's segments (FTS5's "merge" with a negative
# page count first puts every segment on one level, so that repeated steps end in a single
# segment, as "optimize" would in one long write). `total_changes()` around it tells how much
# the step wrote: below 2, nothing was left to merge.
_MERGE_STEP = "INSERT INTO recall_fts(recall_fts, rank) VALUES ('merge', :pages)"
_TOTAL_CHANGES = "SELECT total_changes()"
MERGE_PAGES = 200
"""Pages one merge step writes: about 10 ms of the write lock on this machine."""

_FAR_PAST = datetime(1970, 1, 1, tzinfo=UTC)
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)


class RecallIndexReads:
    """A search's reads of the recall index (the bounded search, the turns next to given
    positions, the texts of chosen entries, whether a user has entries outside a session),
    all through the driver: in a session's transaction or on a lent connection
    (`Database.driver_reading`)."""

    def __init__(self, scope: driver_rows.DriverScope) -> None:
        self.scope = scope
        self.dialect = driver_rows.dialect_of(scope)

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
        terms = [term for term in terms if has_tokens(term)]
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
        # Both run their statements through `driver_rows`, whose errors are StorageErrors.
        if self.dialect == "sqlite":
            return await search_sqlite(
                self.scope,
                terms,
                kinds=ordered_kinds,
                params=params,
                bound=bound or SearchBound(),
            )
        return await search_postgresql(
            self.scope,
            terms,
            kinds=ordered_kinds,
            params=params,
            bound=bound or SearchBound(),
            ranking=ranking,
        )

    async def neighbours(
        self, user_id: str, positions: Collection[tuple[str, int]], *, per_side: int = 2
    ) -> list[IndexedText]:
        """The user's `per_side` turns before and after each (session id, seq), in session
        and sequence order (score 0): the turns next to each, whatever unindexed messages
        (tool calls and results) lie between them."""
        if not positions or per_side < 1:
            return []
        sql = _sqlite_neighbours(per_side) if self.dialect == "sqlite" else _NEIGHBOURS_PG
        found = await driver_rows.rows(
            self.scope,
            sql,
            {
                "user_id": user_id,
                **({} if self.dialect == "sqlite" else {"per_side": per_side}),
                "positions": json.dumps(
                    [{"session_id": sid, "seq": seq} for sid, seq in sorted(set(positions))]
                ),
            },
            timestamps=(ENTRY_TIMESTAMP,),
        )
        return [indexed_text(row, 0.0) for row in found]

    async def texts(self, user_id: str, entry_ids: Collection[int]) -> dict[int, str]:
        """The text of each of these entries of the user's that still exists (a search reads
        its candidates without their text, and then the text of its hits only)."""
        if not entry_ids:
            return {}
        ids = sorted(set(entry_ids))
        found = await driver_rows.rows(
            self.scope,
            _TEXTS[self.dialect],
            {"user_id": user_id, "ids": ids if self.dialect == "postgresql" else json.dumps(ids)},
        )
        return {int(entry_id): body for entry_id, owner, body in found if owner == user_id}

    async def has_entries_outside(self, user_id: str, session_id: str) -> bool:
        """Whether the user has an entry of another session than `session_id`
        (`OTHERS_INDEXED`: a lookup for each of the user's other sessions until one has)."""
        found = await driver_rows.rows(
            self.scope,
            f"SELECT {OTHERS_INDEXED.format(user=':user_id', session=':session_id')}",
            {"user_id": user_id, "session_id": session_id},
        )
        return bool(found and found[0][0])


class RecallIndexRepository(RecallIndexReads):
    """The reads of `RecallIndexReads`, and the index's upkeep (its rebuild, SQLite's merge
    steps, counts), within one `AsyncSession`."""

    def __init__(self, session: AsyncSession) -> None:
        super().__init__(session)
        self.session = session

    async def latest_id(self) -> int:
        """The largest entry id so far (ids only grow: how far the index has been written)."""
        latest = (await self.session.execute(select(func.max(RecallEntry.id)))).scalar_one()
        return int(latest or 0)

    async def merge_step(self, pages: int = MERGE_PAGES) -> bool:
        """SQLite: merge about `pages` pages of the full-text index's segments; whether there
        was anything to merge. FTS5 keeps an index as segments it merges only in part as
        entries are written; each segment costs every word looked up a seek, so a search of
        a long-written index costs several times that of a merged one (`bench/context.py`).
        PostgreSQL's GIN index needs no such care: always False there."""
        if self.dialect != "sqlite":
            return False
        before = (await self.session.execute(text(_TOTAL_CHANGES))).scalar_one()
        await self.session.execute(text(_MERGE_STEP), {"pages": -abs(pages)})
        after = (await self.session.execute(text(_TOTAL_CHANGES))).scalar_one()
        return int(after) - int(before) >= 2

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


async def merge_full_text(database: Database, *, pages: int = MERGE_PAGES) -> int:
    """SQLite: merge the recall index's full-text segments into one, a step per transaction
    (a writer waits for one step at most, and the event loop serves others between steps);
    the steps that merged something. Nothing on PostgreSQL."""
    steps = 0
    while database.is_sqlite:
        async with database.session() as db:
            merged = await RecallIndexRepository(db).merge_step(pages)
        if not merged:
            break
        steps += 1
        await asyncio.sleep(0)
    return steps
