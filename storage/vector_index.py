"""The in-memory search of dense recall (`VectorIndex`): each user's vectors as one float32
matrix, read on incrementally from `recall_vectors`, and the entries nearest to a query. The
storage of the vectors (the rows, their encoding, writing and rebuilding them) is
`storage.recall_vectors`'s; how the search works is described there too.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, Row, select, text
from sqlalchemy.ext.asyncio import AsyncSession
from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

from storage.column_types import UTCDateTime
from storage.models import RecallVector
from storage.recall_entries import ENTRY_COLUMNS, IndexedText, indexed_text
from storage.recall_vectors import TextEmbedder, Vectors, decode_vectors


@dataclass(slots=True)
class _UserMatrix:
    """One user's most recent vectors as read so far: rows [0, size) of the buffers are live,
    in entry order. Rows older than the first one held are read only when a search's window
    reaches past them (`complete`: there are none)."""

    last_entry_id: int = 0
    first_entry_id: int = 0
    complete: bool = False
    size: int = 0
    ids: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    kinds: npt.NDArray[np.int8] = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    matrix: Vectors = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))

    def append(self, ids: Sequence[int], kinds: Sequence[int], vectors: Vectors) -> None:
        """Add newer rows, growing the buffers by doubling (a search adds a few at a time)."""
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

    def prepend(self, ids: Sequence[int], kinds: Sequence[int], vectors: Vectors) -> None:
        """Add older rows (in entry order) in front of those held."""
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
# Up to this many rows (2 ms of the automatic search's window) the product runs on the event
# loop: two thread hops cost more than that when the machine is busy.
_ON_THE_LOOP = 25_000
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
        """The `limit` rows of these kind codes most similar to `vector`, best first."""
        scores = self.matrix @ vector
        scores[~np.isin(self.kinds, codes)] = -np.inf
        take = min(limit, len(scores))
        best = np.argpartition(-scores, take - 1)[:take]
        best = best[np.argsort(-scores[best])]
        return [(int(self.ids[i]), float(scores[i])) for i in best if np.isfinite(scores[i])]


# By primary key only, the user checked on the rows read: with `user_id` in the WHERE clause
# PostgreSQL would rather walk the user's (user, kind, time) index, tens of milliseconds for a
# long history, than look up a hundred ids. The ids go as one parameter (an array, a JSON
# list), so the statement is the same whatever their number: prepared once, planned once.
_READ_ENTRIES = {
    "postgresql": text(
        f"SELECT {ENTRY_COLUMNS}, e.user_id FROM recall_entries e "  # noqa: S608
        "WHERE e.id = ANY(CAST(:ids AS bigint[]))"
    ).columns(occurred_at=UTCDateTime()),
    "sqlite": text(
        f"SELECT {ENTRY_COLUMNS}, e.user_id FROM recall_entries e "  # noqa: S608
        "WHERE e.id IN (SELECT value FROM json_each(:ids))"
    ).columns(occurred_at=UTCDateTime()),
}


@functools.cache
def _one_blas_thread() -> None:
    """Limit the process's BLAS to one thread, once. OpenBLAS would split the vector
    product over the cores and then keep its threads spinning for a while, which doubled the
    search's CPU on two cores and slowed what shared them (the database, the other turns);
    a server already runs its work side by side. Set once for the process rather than around
    each product: changing the limit while another thread multiplies is not safe."""
    ThreadpoolController().limit(limits=1, user_api="blas")


_COLUMNS = (RecallVector.entry_id, RecallVector.kind, RecallVector.vector)
"""What the in-process index reads of a vector row."""


class VectorIndex:
    """The users' vectors in memory, bounded by `max_rows` in all (1 KB each: 500 MB by
    default; least recently searched users are forgotten first, and read again when next
    searched)."""

    def __init__(self, embedder: TextEmbedder, *, max_rows: int = 500_000) -> None:
        self.embedder = embedder
        self.max_rows = max_rows
        _one_blas_thread()
        # (user, kind group) → matrix: turns apart from summaries, so that a search of the
        # few summaries does not read the many turns.
        self._users: OrderedDict[tuple[str, str], _UserMatrix] = OrderedDict()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def embed_query(self, query: str) -> Vectors:
        """The query's vector."""
        vector: Vectors = self.embedder.embed([query])[0]
        return vector

    async def nearest(
        self,
        db: AsyncSession,
        user_id: str,
        vector: Vectors,
        *,
        kinds: Sequence[str],
        limit: int,
        window: int | None = None,
    ) -> list[tuple[int, float]]:
        """The ids of the user's entries of these kinds nearest to `vector`, with their cosine
        similarity, best first; among the `window` most recent of each kind only, if given
        (a search's cost is then bounded, whatever the history)."""
        scored: list[tuple[int, float]] = []
        for group in sorted({_GROUP[kind] for kind in kinds}):
            user = await self._read_on(db, user_id, group, window)
            if user.size == 0 or limit < 1 or not np.any(vector):
                continue
            first = 0 if window is None else max(user.size - window, 0)
            codes = np.array([_KIND_CODES[kind] for kind in kinds], dtype=np.int8)
            rows = _Rows(
                user.ids[first : user.size].copy(),
                user.kinds[first : user.size].copy(),
                user.matrix[first : user.size],
            )
            if len(rows.ids) <= _ON_THE_LOOP:
                scored += rows.best(vector, codes, limit)
            else:
                # 100 MB for 100,000 entries: in a worker thread (numpy lets the GIL go), so
                # the event loop serves others meanwhile.
                scored += await asyncio.to_thread(rows.best, vector, codes, limit)
        scored.sort(key=lambda found: -found[1])
        return scored[:limit]

    async def entries(
        self, db: AsyncSession, user_id: str, found: Sequence[tuple[int, float]]
    ) -> list[IndexedText]:
        """The entries of `nearest`'s result, in its order, scored by similarity; entries
        deleted since are left out (and forgotten)."""
        if not found:
            return []
        ids = [entry_id for entry_id, _ in found]
        dialect = db.get_bind().dialect.name
        rows = await db.execute(
            _READ_ENTRIES[dialect], {"ids": ids if dialect == "postgresql" else json.dumps(ids)}
        )
        by_id = {row[0]: tuple(row)[:-1] for row in rows if row[-1] == user_id}
        gone = [entry_id for entry_id, _ in found if entry_id not in by_id]
        if gone:
            for (user, _), matrix in self._users.items():
                if user == user_id:
                    live = matrix.kinds[: matrix.size]
                    live[np.isin(matrix.ids[: matrix.size], gone)] = _GONE
        return [indexed_text(by_id[i], score) for i, score in found if i in by_id]

    def held_rows(self, user_id: str) -> int:
        """How many of the user's vectors are in memory (all kind groups)."""
        return sum(matrix.size for (user, _), matrix in self._users.items() if user == user_id)

    def forget(self, user_id: str | None = None) -> None:
        """Drop a user's matrices (or everyone's): the next search reads them again."""
        for key in [key for key in self._users if user_id is None or key[0] == user_id]:
            del self._users[key]

    async def _read_on(
        self, db: AsyncSession, user_id: str, group: str, window: int | None
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
            mine = (
                RecallVector.user_id == user_id,
                RecallVector.kind.in_(_KINDS_OF[group]),
                RecallVector.model == self.embedder.model_id,
            )
            if user.size == 0:
                # Newest first, as many as the window: the rows before them are read when a
                # larger window asks for them.
                await self._read_back(db, user, mine, window, older=False)
                return user
            newer = select(*_COLUMNS).where(*mine, RecallVector.entry_id > user.last_entry_id)
            rows = list((await db.execute(newer.order_by(RecallVector.entry_id))).all())
            if rows:
                self._add(user, rows, older=False)
            missing = None if window is None else window - user.size
            if not user.complete and (missing is None or missing > 0):
                before = (*mine, RecallVector.entry_id < user.first_entry_id)
                await self._read_back(db, user, before, missing, older=True)
            return user

    async def _read_back(
        self,
        db: AsyncSession,
        user: _UserMatrix,
        conditions: Sequence[ColumnElement[bool]],
        limit: int | None,
        *,
        older: bool,
    ) -> None:
        """Add the newest `limit` rows matching `conditions` (all for None) to the matrix, in
        entry order; the matrix holds all of the user's rows once fewer than asked came."""
        statement = select(*_COLUMNS).where(*conditions).order_by(RecallVector.entry_id.desc())
        if limit is not None:
            statement = statement.limit(limit)
        rows = list(reversed((await db.execute(statement)).all()))
        user.complete = limit is None or len(rows) < limit
        if rows:
            self._add(user, rows, older=older)

    def _add(self, user: _UserMatrix, rows: Sequence[Row[int, str, bytes]], *, older: bool) -> None:
        ids = [row.entry_id for row in rows]
        kinds = [_KIND_CODES.get(row.kind, _GONE) for row in rows]
        vectors = decode_vectors([row.vector for row in rows], self.embedder.dimensions)
        if older:
            user.prepend(ids, kinds, vectors)
        else:
            user.append(ids, kinds, vectors)
        self._evict()

    def _evict(self) -> None:
        total = sum(user.size for user in self._users.values())
        while total > self.max_rows and len(self._users) > 1:
            _, dropped = self._users.popitem(last=False)
            total -= dropped.size
