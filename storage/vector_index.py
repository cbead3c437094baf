"""The in-memory search of dense recall (`VectorIndex`): each user's vectors as one float32
matrix, read on incrementally from `recall_vectors`, and the entries nearest to a query. The
storage of the vectors (the rows, their encoding, writing and rebuilding them) is
`storage.recall_vectors`'s; how the search works is described there too.
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

from storage import driver_rows
from storage.recall_entries import IndexedText, indexed_text
from storage.recall_vectors import TextEmbedder, Vectors, decode_vectors

Entry = tuple[int, str, str, int, int | None, str, str, datetime]
"""An entry's columns as `storage.recall_entries.indexed_text` takes them (no text)."""


@dataclass(slots=True)
class _UserMatrix:
    """One user's most recent vectors as read so far, with their entries (without text):
    rows [0, size) of the buffers are live, in entry order, and `entries` holds their entries
    in the same order. Rows older than the first one held are read only when a search's
    window reaches past them (`complete`: there are none)."""

    last_entry_id: int = 0
    first_entry_id: int = 0
    complete: bool = False
    size: int = 0
    ids: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    kinds: npt.NDArray[np.int8] = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    matrix: Vectors = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    # Extended in place as newer rows come (a search's slice keeps its positions); replaced
    # as a whole when older rows go in front.
    entries: list[Entry] = field(default_factory=list)
    # One string object for each session id, speaker and kind held (they repeat).
    strings: dict[str, str] = field(default_factory=dict)

    def append(
        self, ids: Sequence[int], kinds: Sequence[int], vectors: Vectors, entries: Sequence[Entry]
    ) -> None:
        """Add newer rows, growing the buffers by doubling (a search adds a few at a time)."""
        self.entries.extend(entries)
        needed = self.size + len(ids)
        if needed > len(self.ids):
            self._grow(max(needed, 2 * len(self.ids), 64), vectors.shape[1], at=0)
        self.ids[self.size : needed] = ids
        self.kinds[self.size : needed] = kinds
        self.matrix[self.size : needed] = vectors
        if self.size == 0:
            self.first_entry_id = int(ids[0])
        self.size = needed
        self.last_entry_id = max(self.last_entry_id, int(ids[-1]))

    def prepend(
        self, ids: Sequence[int], kinds: Sequence[int], vectors: Vectors, entries: Sequence[Entry]
    ) -> None:
        """Add older rows (in entry order) in front of those held."""
        self.entries = [*entries, *self.entries]
        count = len(ids)
        grown = self.size + count
        self._grow(grown, vectors.shape[1], at=count)
        self.ids[:count] = ids
        self.kinds[:count] = kinds
        self.matrix[:count] = vectors
        self.size = grown
        self.first_entry_id = int(ids[0])

    def _grow(self, capacity: int, dimensions: int, *, at: int) -> None:
        """New buffers of `capacity` rows holding the live rows from row `at` on."""
        matrix = np.zeros((capacity, dimensions), dtype=np.float32)
        ids = np.zeros(capacity, dtype=np.int64)
        kinds = np.zeros(capacity, dtype=np.int8)
        matrix[at : at + self.size] = self.matrix[: self.size]
        ids[at : at + self.size] = self.ids[: self.size]
        kinds[at : at + self.size] = self.kinds[: self.size]
        self.matrix, self.ids, self.kinds = matrix, ids, kinds


_KIND_CODES = {"turn": 1, "summary": 2, "compaction": 3}
_CODES = 4  # the codes above and _GONE
# Up to this many rows (2 ms of the automatic search's window) the product runs on the event
# loop: two thread hops cost more than that when the machine is busy.
_ON_THE_LOOP = 25_000
# From this many rows on, a product started ahead of need (`Scorer.start`) runs in a worker
# thread, overlapping what the event loop does meanwhile.
_OVERLAPPED = 4_000
_GONE = 0
_GROUP = {"turn": "turns", "summary": "summaries", "compaction": "summaries"}
_KINDS_OF = {"turns": ("turn",), "summaries": ("summary", "compaction")}


@dataclass(frozen=True, slots=True)
class _Rows:
    """A slice of a user's matrix, taken on the event loop (a search reading on may grow the
    buffers meanwhile; the slice stays whole)."""

    ids: npt.NDArray[np.int64]
    kinds: npt.NDArray[np.int8]
    matrix: Vectors

    def best(
        self, vector: Vectors, codes: npt.NDArray[np.int8], limit: int
    ) -> list[tuple[int, float]]:
        """The positions of the `limit` rows of these kind codes most similar to `vector`,
        best first, with their similarity."""
        scores = self.matrix @ vector
        wanted = np.zeros(_CODES, dtype=bool)
        wanted[codes] = True
        scores[~wanted[self.kinds]] = -np.inf
        take = min(limit, len(scores))
        best = np.argpartition(-scores, take - 1)[:take]
        best = best[np.argsort(-scores[best])]
        similarities = scores[best]
        live = np.isfinite(similarities)
        return list(zip(best[live].tolist(), similarities[live].tolist(), strict=True))


@dataclass(frozen=True, slots=True)
class _Part:
    """One kind group's rows of a `Scorer`, and their entries from position `first` on."""

    rows: _Rows
    entries: list[Entry]
    first: int


@dataclass(frozen=True, slots=True)
class Scorer:
    """A user's vectors as a search found them (`VectorIndex.scorer`): scoring them reads no
    database and touches nothing the event loop changes, so it may run in another thread."""

    parts: tuple[_Part, ...]
    codes: npt.NDArray[np.int8]

    @property
    def rows(self) -> int:
        """How many vectors a query is scored against."""
        return sum(len(part.rows.ids) for part in self.parts)

    def start(self, vector: Vectors, limit: int) -> asyncio.Future[list[IndexedText]]:
        """`nearest`, started now for a caller with other work to do before it needs the
        result: in a worker thread from `_OVERLAPPED` vectors on, at once below (the thread's
        hop would cost more than it saves)."""
        if self.rows >= _OVERLAPPED:
            return asyncio.ensure_future(asyncio.to_thread(self.nearest, vector, limit))
        done: asyncio.Future[list[IndexedText]] = asyncio.get_running_loop().create_future()
        done.set_result(self.nearest(vector, limit))
        return done

    def nearest(self, vector: Vectors, limit: int) -> list[IndexedText]:
        """The `limit` entries nearest to `vector`, scored by cosine similarity, best first."""
        if limit < 1 or not np.any(vector):
            return []
        scored: list[IndexedText] = []
        for part in self.parts:
            if len(part.rows.ids):
                best = part.rows.best(vector, self.codes, limit)
                scored += [
                    indexed_text(part.entries[part.first + at], similarity)
                    for at, similarity in best
                ]
        scored.sort(key=lambda entry: -entry.score)
        return scored[:limit]


# A user's vectors of a kind group with their entries: the rows written after a given entry
# (reading on), or the newest rows before one (a first read, and reading further back).
#
# PostgreSQL finds the rows' ids first, in (user_id, model, kind, entry_id) (migration 0010:
# an index-only scan, one range a kind), then each vector and entry by its primary key
# (LATERAL, kept apart by OFFSET 0). In one scan with the vectors' columns, the planner
# multiplied the user's share of the rows by the share newer (or older) than the bound as if
# they were independent, and where a few users hold most rows it walked the primary key
# from the bound through every row the others wrote: 61-82 ms a turn reading on, 72-92 ms a
# first read, for a user of 100,000 entries beside another as large (EXPLAIN ANALYZE). The
# ids' scan costs less than that walk on any estimate: a narrower range, without the table.
_READ_POSTGRESQL = """
SELECT ids.entry_id, v.kind, v.vector, e.session_id, e.source_id, e.seq, e.speaker,
       e.channel_type, e.occurred_at
FROM (
    SELECT i.entry_id FROM recall_vectors i
    WHERE i.user_id = :user_id AND i.model = :model AND i.kind IN (__KINDS__) AND __RANGE__
) AS ids CROSS JOIN LATERAL (
    SELECT r.kind, r.vector FROM recall_vectors r WHERE r.entry_id = ids.entry_id OFFSET 0
) AS v CROSS JOIN LATERAL (
    SELECT n.session_id, n.source_id, n.seq, n.speaker, n.channel_type, n.occurred_at
    FROM recall_entries n WHERE n.id = ids.entry_id OFFSET 0
) AS e
ORDER BY ids.entry_id__DIRECTION__
"""
# SQLite drives from the vectors through the same index (CROSS JOIN fixes the join order),
# each entry by its primary key.
_READ_SQLITE = """
SELECT v.entry_id, v.kind, v.vector, e.session_id, e.source_id, e.seq, e.speaker,
       e.channel_type, e.occurred_at
FROM recall_vectors v CROSS JOIN recall_entries e ON e.id = v.entry_id
WHERE v.user_id = :user_id AND v.model = :model AND v.kind IN (__KINDS__) AND __RANGE__
"""
_READ_TIMESTAMP = 8  # the position of `occurred_at` in the rows read
_UNLIMITED = 2**62


def _statement(dialect: str, group: str, *, newer: bool) -> str:
    kinds = ", ".join(f"'{kind}'" for kind in _KINDS_OF[group])
    postgresql = dialect == "postgresql"
    column = "i.entry_id" if postgresql else "v.entry_id"
    rows = (
        f"{column} > :after ORDER BY {column}"
        if newer
        else f"{column} < :before ORDER BY {column} DESC LIMIT :limit"
    )
    template = _READ_SQLITE
    if postgresql:
        # The ids' scan kept apart from the lookups (reading back, its LIMIT does that).
        rows += " OFFSET 0" if newer else ""
        template = _READ_POSTGRESQL.replace("__DIRECTION__", "" if newer else " DESC")
    return template.replace("__KINDS__", kinds).replace("__RANGE__", rows)


_DIALECTS = ("postgresql", "sqlite")
_READ_NEWER = {
    (dialect, group): _statement(dialect, group, newer=True)
    for dialect in _DIALECTS
    for group in _KINDS_OF
}
_READ_OLDER = {
    (dialect, group): _statement(dialect, group, newer=False)
    for dialect in _DIALECTS
    for group in _KINDS_OF
}


@functools.cache
def _one_blas_thread() -> None:
    """Limit the process's BLAS to one thread, once. OpenBLAS would split the vector
    product over the cores and then keep its threads spinning for a while, which doubled the
    search's CPU on two cores and slowed what shared them (the database, the other turns);
    a server already runs its work side by side. Set once for the process rather than around
    each product: changing the limit while another thread multiplies is not safe."""
    ThreadpoolController().limit(limits=1, user_api="blas")


class VectorIndex:
    """The users' vectors in memory, with their entries (not their text), bounded by
    `max_rows` in all (1 KB a vector, about 0.2 KB an entry: 600 MB by default; least
    recently searched users are forgotten first, and read again when next searched)."""

    def __init__(self, embedder: TextEmbedder, *, max_rows: int = 500_000) -> None:
        self.embedder = embedder
        self.max_rows = max_rows
        _one_blas_thread()
        # (user, kind group) → matrix: turns apart from summaries, so that a search of the
        # few summaries does not read the many turns.
        self._users: OrderedDict[tuple[str, str], _UserMatrix] = OrderedDict()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        # The rows of all matrices: kept as they change, not summed over every user held at
        # every read (a read on adds a few rows to one user's matrix at every turn).
        self._held = 0

    def embed_query(self, query: str) -> Vectors:
        """The query's vector."""
        vector: Vectors = self.embedder.embed([query])[0]
        return vector

    async def nearest(
        self,
        db: driver_rows.DriverScope,
        user_id: str,
        vector: Vectors,
        *,
        kinds: Sequence[str],
        limit: int,
        window: int | None = None,
    ) -> list[IndexedText]:
        """The user's entries of these kinds nearest to `vector`, scored by their cosine
        similarity, best first; among the `window` most recent of each kind only, if given
        (a search's cost is then bounded, whatever the history). Entries deleted since they
        were read may be among them: `RecallIndexRepository.texts` does not find them, and
        `drop` forgets them."""
        scorer = await self.scorer(db, user_id, kinds=kinds, window=window)
        if scorer.rows <= _ON_THE_LOOP:
            return scorer.nearest(vector, limit)
        # 100 MB for 100,000 entries: in a worker thread (numpy lets the GIL go), so the
        # event loop serves others meanwhile.
        return await asyncio.to_thread(scorer.nearest, vector, limit)

    async def scorer(
        self,
        db: driver_rows.DriverScope,
        user_id: str,
        *,
        kinds: Sequence[str],
        window: int | None = None,
    ) -> Scorer:
        """The user's entries of these kinds, read on (see `nearest`), to be scored by a
        `Scorer`: on the event loop or in another thread, while the search reads on."""
        parts: list[_Part] = []
        codes = np.array([_KIND_CODES[kind] for kind in kinds], dtype=np.int8)
        for group in sorted({_GROUP[kind] for kind in kinds}):
            user = await self._read_on(db, user_id, group, window)
            first = 0 if window is None else max(user.size - window, 0)
            rows = _Rows(
                user.ids[first : user.size].copy(),
                user.kinds[first : user.size].copy(),
                user.matrix[first : user.size],
            )
            # Positions stay valid: newer entries are appended to this list, older ones make a
            # new list.
            parts.append(_Part(rows, user.entries, first))
        return Scorer(tuple(parts), codes)

    def drop(self, user_id: str, entry_ids: Collection[int]) -> None:
        """Forget these entries of the user's (deleted since they were read)."""
        gone = np.fromiter(entry_ids, dtype=np.int64)
        for (user, _), matrix in self._users.items():
            if user == user_id and len(gone):
                live = matrix.kinds[: matrix.size]
                live[np.isin(matrix.ids[: matrix.size], gone)] = _GONE

    def held_rows(self, user_id: str) -> int:
        """How many of the user's vectors are in memory (all kind groups)."""
        return sum(matrix.size for (user, _), matrix in self._users.items() if user == user_id)

    def forget(self, user_id: str | None = None) -> None:
        """Drop a user's matrices (or everyone's): the next search reads them again."""
        for key in [key for key in self._users if user_id is None or key[0] == user_id]:
            self._held -= self._users.pop(key).size

    async def _read_on(
        self, db: driver_rows.DriverScope, user_id: str, group: str, window: int | None
    ) -> _UserMatrix:
        """The user's matrix of this kind group, read on: the rows written since the last
        search, and older ones while it holds fewer than `window` (all of them for None). A
        first search therefore reads its window, not the whole history."""
        key = (user_id, group)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            user = self._users.get(key)
            if user is None:
                user = self._users[key] = _UserMatrix(
                    matrix=np.zeros((0, self.embedder.dimensions), dtype=np.float32)
                )
            self._users.move_to_end(key)
            mine = {"user_id": user_id, "model": self.embedder.model_id}
            if user.size == 0:
                # Newest first, as many as the window: the rows before them are read when a
                # larger window asks for them.
                await self._read_back(
                    db, user, group, mine, before=_UNLIMITED, limit=window, older=False
                )
                return user
            dialect = driver_rows.dialect_of(db)
            rows = await driver_rows.rows(
                db,
                _READ_NEWER[dialect, group],
                {**mine, "after": user.last_entry_id},
                timestamps=(_READ_TIMESTAMP,),
            )
            if rows:
                self._add(user, rows, older=False)
            missing = None if window is None else window - user.size
            if not user.complete and (missing is None or missing > 0):
                await self._read_back(
                    db, user, group, mine, before=user.first_entry_id, limit=missing, older=True
                )
            return user

    async def _read_back(
        self,
        db: driver_rows.DriverScope,
        user: _UserMatrix,
        group: str,
        mine: dict[str, str],
        *,
        before: int,
        limit: int | None,
        older: bool,
    ) -> None:
        """Add the newest `limit` rows before entry `before` (all for None) to the matrix, in
        entry order; the matrix holds all of the user's rows once fewer than asked came."""
        params = {**mine, "before": before, "limit": _UNLIMITED if limit is None else limit}
        statement = _READ_OLDER[driver_rows.dialect_of(db), group]
        rows = await driver_rows.rows(db, statement, params, timestamps=(_READ_TIMESTAMP,))
        rows.reverse()
        user.complete = limit is None or len(rows) < limit
        if rows:
            self._add(user, rows, older=older)

    def _add(self, user: _UserMatrix, rows: Sequence[tuple[Any, ...]], *, older: bool) -> None:
        # entry id, kind, vector, then the entry's columns as `_READ_POSTGRESQL` lists them
        strings = user.strings
        ids: list[int] = []
        kinds: list[int] = []
        entries: list[Entry] = []
        blobs: list[bytes] = []
        for row in rows:
            entry_id, kind, blob, session_id, source_id, seq, speaker, channel, occurred_at = row
            ids.append(entry_id)
            kinds.append(_KIND_CODES.get(kind, _GONE))
            blobs.append(blob)
            entries.append(
                (
                    entry_id,
                    strings.setdefault(session_id, session_id),
                    strings.setdefault(kind, kind),
                    source_id,
                    seq,
                    strings.setdefault(speaker, speaker),
                    strings.setdefault(channel, channel),
                    occurred_at,
                )
            )
        vectors = decode_vectors(blobs, self.embedder.dimensions)
        if older:
            user.prepend(ids, kinds, vectors, entries)
        else:
            user.append(ids, kinds, vectors, entries)
        self._held += len(ids)
        self._evict()

    def _evict(self) -> None:
        while self._held > self.max_rows and len(self._users) > 1:
            _, dropped = self._users.popitem(last=False)
            self._held -= dropped.size
