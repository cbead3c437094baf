"""The vectors of dense recall: one embedding per recall entry, and the nearest ones to a query.

Storage (`recall_vectors`, migration 0007): a row per embedded entry, the vector as float16
bytes, written in the transaction that writes the entry's source row (`write_turn_vectors`
for the messages of a turn, `write_source_vectors` for summaries), removed with the entry (a
foreign key) and when its text changes (a trigger). The embedding model is not storage's: a
`TextEmbedder` reaches the writers through the database session's `info`
(`EMBEDDER_KEY`, set by `storage.database.Database.use_embedder`); without one nothing is
embedded and dense recall finds nothing.

Search (`VectorIndex`, in `storage.vector_index`): both backends keep the vectors in the
database and search them in process, as one float32 matrix per user held in memory with the
entries' columns but their text, and read on incrementally (the rows
with a larger entry id than the last one read), so a search reads only what was written since
the previous one; a user's first search reads only its window (the newest `vector_window`
rows: 10,000 for the automatic search, half the 20,000 that took about 0.6 s, where the
whole history of 100,000 took 2-5 s), and a larger window later reads the older rows it
lacks. It scores the user's most recent entries (the search bound's `vector_window`) with
one matrix product (one BLAS thread, set for the process; in a worker thread past
`_ON_THE_LOOP` rows, and the automatic search scores the turns in one while it reads their
words: `VectorIndex.scorer`): about 1.5 ms for 10,000 entries once they have left the
processor's caches, 5-20 ms for 100,000 on this machine's memory bandwidth. PostgreSQL's
pgvector would do the same in the server, but the server here does not have it (`CREATE
EXTENSION vector` fails), and a portable table serves both backends alike. Entries deleted
since they were read are dropped from the matrix when a search reading its hits' texts finds
them gone (`VectorIndex.drop`); a deleted
user's matrix stays in memory until it is the least recently searched (it is never searched
again).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
from sqlalchemy import Table, delete, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from storage import driver_rows
from storage.database import EMBEDDER_KEY
from storage.models import RecallEntry, RecallVector

Vectors = npt.NDArray[np.float32]
VECTORS: Table = RecallVector.__table__  # type: ignore[assignment]


class TextEmbedder(Protocol):
    """Turns texts into unit-length vectors (`sessions.recall_embedding.StaticEmbedder`)."""

    model_id: str
    dimensions: int

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One row per text."""
        ...


def embedder_of(db: driver_rows.DriverScope) -> TextEmbedder | None:
    """The embedder the scope's database was given, if any."""
    embedder: TextEmbedder | None = db.info.get(EMBEDDER_KEY)
    return embedder


def encode_vector(vector: Vectors) -> bytes:
    """A vector as stored: float16, little-endian."""
    return vector.astype("<f2").tobytes()


def decode_vectors(blobs: Sequence[bytes], dimensions: int) -> Vectors:
    """Stored vectors as one float32 matrix (a row per blob)."""
    if not blobs:
        return np.zeros((0, dimensions), dtype=np.float32)
    joined = np.frombuffer(b"".join(blobs), dtype="<f2").reshape(len(blobs), dimensions)
    return joined.astype(np.float32)


@functools.lru_cache(maxsize=32)
def _insert_turn(count: int, dialect: str) -> str:
    """The vectors of `count` messages of a session, matched to their entries by position
    (a `VALUES` list's columns are `column1`, `column2` on both backends).

    On PostgreSQL the kind is compared with IS NOT DISTINCT FROM, which no index serves: the
    statement is prepared, and its generic plan, made while the table's statistics are off (a
    new database, or one grown since autovacuum's last pass), read the (kind, source_id)
    index's 'turn' range, every turn of every user, for the session's few (1,400 rows read
    for 8 kept in an EXPLAIN of a 200-user `bench/e2e.py` database). Only (session_id, seq)
    is left to serve it, on the turn's range of positions: not the whole session's."""
    kind = "IS NOT DISTINCT FROM" if dialect == "postgresql" else "="
    return f"""INSERT INTO recall_vectors (entry_id, user_id, kind, model, vector)
    SELECT e.id, e.user_id, e.kind, :model, v.column2 FROM recall_entries e
    JOIN (VALUES {driver_rows.values_list(("seq", "vector"), count)}) AS v ON e.seq = v.column1
    WHERE e.session_id = :session_id AND e.seq BETWEEN :first AND :last
      AND e.kind {kind} 'turn'"""  # noqa: S608 (placeholders only)


_INSERT_SOURCE = text(
    """INSERT INTO recall_vectors (entry_id, user_id, kind, model, vector)
    SELECT e.id, e.user_id, e.kind, :model, :vector FROM recall_entries e
    WHERE e.kind = :kind AND e.source_id = :source_id"""
)


async def write_turn_vectors(
    db: driver_rows.DriverScope, session_id: str, messages: Sequence[tuple[int, str, str]]
) -> int:
    """Embed the indexed ones of a turn's messages, given as (seq, role, content), and store
    their vectors (one statement for the turn, through the driver as the turn's other writes);
    how many were embedded. Nothing without an embedder."""
    embedder = embedder_of(db)
    indexed = [
        (seq, content)
        for seq, role, content in messages
        if role in ("user", "assistant") and content.strip()
    ]
    if embedder is None or not indexed:
        return 0
    vectors = embedder.embed([content for _, content in indexed])
    await driver_rows.send(
        db,
        _insert_turn(len(indexed), driver_rows.dialect_of(db)),
        {
            "session_id": session_id,
            "model": embedder.model_id,
            "first": min(seq for seq, _ in indexed),
            "last": max(seq for seq, _ in indexed),
            **driver_rows.numbered(
                [
                    {"seq": seq, "vector": encode_vector(vector)}
                    for (seq, _), vector in zip(indexed, vectors, strict=True)
                ]
            ),
        },
    )
    return len(indexed)


async def write_source_vectors(
    db: AsyncSession, kind: str, items: Sequence[tuple[int, str]]
) -> int:
    """Store the vectors of summaries or compactions given as (source row id, text); how many
    were embedded. Nothing without an embedder."""
    embedder = embedder_of(db)
    items = [(source_id, body) for source_id, body in items if body.strip()]
    if embedder is None or not items:
        return 0
    vectors = embedder.embed([body for _, body in items])
    await db.execute(
        _INSERT_SOURCE,
        [
            {
                "kind": kind,
                "source_id": source_id,
                "model": embedder.model_id,
                "vector": encode_vector(vector),
            }
            for (source_id, _), vector in zip(items, vectors, strict=True)
        ],
    )
    return len(items)


async def rebuild_vectors(
    db: AsyncSession,
    embedder: TextEmbedder,
    *,
    batch: int = 2_000,
    on_progress: Callable[[int, int], None] | None = None,
) -> int:
    """Embed every recall entry again (after `RecallIndexRepository.rebuild`, or to change
    the model); how many. `on_progress(done, total)` is called after each batch."""
    await db.execute(delete(RecallVector))
    total = len((await db.execute(select(RecallEntry.id))).all())
    done, last_id = 0, 0
    while True:
        rows = (
            await db.execute(
                select(RecallEntry.id, RecallEntry.user_id, RecallEntry.kind, RecallEntry.body)
                .where(RecallEntry.id > last_id)
                .order_by(RecallEntry.id)
                .limit(batch)
            )
        ).all()
        if not rows:
            break
        vectors = embedder.embed([row.body for row in rows])
        await db.execute(
            insert(VECTORS),
            [
                {
                    "entry_id": row.id,
                    "user_id": row.user_id,
                    "kind": row.kind,
                    "model": embedder.model_id,
                    "vector": encode_vector(vector),
                }
                for row, vector in zip(rows, vectors, strict=True)
            ],
        )
        done += len(rows)
        last_id = rows[-1].id
        if on_progress is not None:
            on_progress(done, total)
    return done
