"""Dense recall's vectors are kept in step with the recall index: written with every turn,
summary and compaction while an embedder is set, gone with their entry (a deleted session or
user, a changed text), all written again by a rebuild; the in-process index finds a user's
nearest entries, reads on as entries are written, and never crosses users."""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Sequence
from datetime import timedelta
from typing import ClassVar

import numpy as np
import pytest
from sqlalchemy import func, select, update
from sqlalchemy import text as sql_text
from sqlalchemy.ext.asyncio import AsyncSession

from storage.database import Database
from storage.models import RecallVector, SessionCompaction, SessionMessage, SessionSummary
from storage.recall_entries import COMPACTION, SUMMARY, TURN, IndexedText
from storage.recall_index import RecallIndexRepository
from storage.recall_vectors import Vectors, _insert_turn, rebuild_vectors
from storage.repositories.compactions import CompactionRepository
from storage.repositories.sessions import SessionRepository
from storage.repositories.summaries import SummaryRepository
from storage.repositories.users import UserRepository
from storage.vector_index import _READ_NEWER, _READ_OLDER, VectorIndex
from tests.storage.test_recall_index import T0, make_session, make_user


class ConceptEmbedder:
    """A real, tiny embedder: each word is a unit vector of its concept (synonyms share
    one), so texts about the same thing are near without sharing a word."""

    model_id = "concepts-v1"
    dimensions = 8
    CONCEPTS: ClassVar[dict[str, int]] = {
        "car": 0,
        "automobile": 0,
        "vehicle": 0,
        "kitten": 1,
        "cat": 1,
        "invoice": 2,
        "bill": 2,
        "holiday": 3,
        "vacation": 3,
    }

    def embed(self, texts: Sequence[str]) -> Vectors:
        vectors = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().replace(".", " ").split():
                concept = self.CONCEPTS.get(word)
                if concept is not None:
                    vectors[row, concept] += 1.0
                else:
                    # crc32, not hash(): the same vector in every process (hash seeds vary)
                    vectors[row, 4 + zlib.crc32(word.encode()) % 4] += 0.1
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        unit: Vectors = vectors / np.maximum(norms, 1e-9)
        return unit


async def vector_count(database: Database, user_id: str | None = None) -> int:
    async with database.session() as db:
        statement = select(func.count()).select_from(RecallVector)
        if user_id is not None:
            statement = statement.where(RecallVector.user_id == user_id)
        return int((await db.execute(statement)).scalar_one())


async def nearest(
    database: Database, index: VectorIndex, user_id: str, query: str, kinds=(TURN,)
) -> list[str]:
    async with database.session() as db:
        found = await index.nearest(db, user_id, index.embed_query(query), kinds=kinds, limit=3)
        return await texts_of(db, index, user_id, found)


async def texts_of(
    db: AsyncSession, index: VectorIndex, user_id: str, found: Sequence[IndexedText]
) -> list[str]:
    """The texts of what `nearest` found, as a search reads them for its hits: entries
    deleted since are left out, and the index forgets them."""
    texts = await RecallIndexRepository(db).texts(user_id, [entry.entry_id for entry in found])
    index.drop(user_id, [entry.entry_id for entry in found if entry.entry_id not in texts])
    return [texts[entry.entry_id] for entry in found if entry.entry_id in texts]


@pytest.fixture
def embedder(database: Database) -> ConceptEmbedder:
    embedder = ConceptEmbedder()
    database.use_embedder(embedder)
    return embedder


async def test_every_indexed_text_gets_a_vector_when_written(
    database: Database, embedder: ConceptEmbedder
) -> None:
    await make_user(database, "alice", "Alice")
    session_id = await make_session(
        database,
        "alice",
        ("user", "My automobile broke down."),
        ("tool", "a tool result is not indexed"),
        ("assistant", "Sorry about the vehicle."),
    )
    async with database.session() as db:
        await SummaryRepository(db).add(
            SessionSummary(session_id=session_id, user_id="alice", summary="Car trouble")
        )
        await CompactionRepository(db).add(
            SessionCompaction(
                session_id=session_id,
                seq=1,
                first_message_seq=1,
                last_message_seq=2,
                messages_compacted=2,
                tokens_before=10,
                tokens_after=5,
                archive_ref="ref",
                summary="The car broke down.",
            )
        )
    async with database.session() as db:
        rows = (await db.execute(select(RecallVector.kind, RecallVector.model))).all()
    assert sorted(kind for kind, _ in rows) == sorted([TURN, TURN, SUMMARY, COMPACTION])
    assert {model for _, model in rows} == {"concepts-v1"}


async def test_without_an_embedder_nothing_is_embedded(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    await make_session(database, "alice", ("user", "My car broke down."))
    assert await vector_count(database) == 0


async def test_vectors_go_with_their_entry(database: Database, embedder: ConceptEmbedder) -> None:
    await make_user(database, "alice", "Alice")
    await make_user(database, "bob", "Bob")
    gone = await make_session(database, "alice", ("user", "car"), ("assistant", "cat"))
    kept = await make_session(database, "alice", ("user", "invoice"))
    await make_session(database, "bob", ("user", "holiday"))
    async with database.session() as db:
        assert await SessionRepository(db).delete(gone)
    assert await vector_count(database, "alice") == 1
    async with database.session() as db:
        assert await UserRepository(db).delete("bob")
    assert await vector_count(database, "bob") == 0
    # A changed text loses its vector: it described the old text.
    async with database.session() as db:
        await db.execute(
            update(SessionMessage)
            .where(SessionMessage.session_id == kept)
            .values(content="vacation plans")
        )
    assert await vector_count(database, "alice") == 0


async def test_rebuild_writes_every_vector_again(
    database: Database, embedder: ConceptEmbedder
) -> None:
    await make_user(database, "alice", "Alice")
    database.use_embedder(None)
    await make_session(database, "alice", *[("user", f"car number {n}") for n in range(5)])
    assert await vector_count(database) == 0
    progress: list[tuple[int, int]] = []
    async with database.session() as db:
        assert await RecallIndexRepository(db).rebuild() == 5
        done = await rebuild_vectors(
            db, embedder, batch=2, on_progress=lambda *p: progress.append(p)
        )
    assert done == 5
    assert progress == [(2, 5), (4, 5), (5, 5)]
    assert await vector_count(database, "alice") == 5


async def test_the_index_finds_meaning_reads_on_and_keeps_users_apart(
    database: Database, embedder: ConceptEmbedder
) -> None:
    await make_user(database, "alice", "Alice")
    await make_user(database, "bob", "Bob")
    await make_session(
        database, "alice", ("user", "The kitten sleeps all day."), ("user", "Pay the bill.")
    )
    await make_session(database, "bob", ("user", "My automobile is red."))
    index = VectorIndex(embedder)
    assert (await nearest(database, index, "alice", "cat"))[0] == "The kitten sleeps all day."
    assert await nearest(database, index, "alice", "invoice") == [
        "Pay the bill.",
        "The kitten sleeps all day.",
    ]
    assert "My automobile is red." not in await nearest(database, index, "alice", "car")
    # Written after the first search: read on the next one.
    async with database.session() as db:
        session = await SessionRepository(db).create("alice", "acme", at=T0 + timedelta(days=1))
        await SessionRepository(db).append_message(
            session.id, role="user", channel_type="web", content="A vehicle for sale.", at=T0
        )
    assert (await nearest(database, index, "alice", "car"))[0] == "A vehicle for sale."
    # Deleted after it was read: not found any more.
    async with database.session() as db:
        assert await SessionRepository(db).delete(session.id)
    assert "A vehicle for sale." not in await nearest(database, index, "alice", "car")


async def test_a_first_search_reads_its_window_and_a_larger_window_reads_further_back(
    database: Database, embedder: ConceptEmbedder
) -> None:
    await make_user(database, "alice", "Alice")
    await make_session(
        database,
        "alice",
        ("user", "The kitten sleeps all day."),
        *[("user", f"Note {number}.") for number in range(6)],
        ("user", "Pay the bill."),
    )
    index = VectorIndex(embedder)

    async def nearest_within(query: str, window: int | None) -> list[str]:
        async with database.session() as db:
            vector = index.embed_query(query)
            found = await index.nearest(db, "alice", vector, kinds=(TURN,), limit=1, window=window)
            return await texts_of(db, index, "alice", found)

    # The 3 most recent turns only: the kitten, 8 turns back, is neither read nor found.
    assert await nearest_within("invoice", 3) == ["Pay the bill."]
    assert index.held_rows("alice") == 3
    assert await nearest_within("cat", 3) != ["The kitten sleeps all day."]
    # A wider window reads the older rows it lacks, and then finds it.
    assert await nearest_within("cat", 20) == ["The kitten sleeps all day."]
    assert index.held_rows("alice") == 8
    # Newer rows are read on as before, older ones not again.
    await make_session(database, "alice", ("user", "The cat is back."))
    assert await nearest_within("cat", None) == ["The cat is back."]
    assert index.held_rows("alice") == 9


async def test_the_least_recently_searched_users_are_forgotten_past_the_memory_bound(
    database: Database, embedder: ConceptEmbedder
) -> None:
    for user in ("alice", "bob", "carol"):
        await make_user(database, user, user.title())
        await make_session(database, user, ("user", "My car."), ("user", "The invoice."))
    index = VectorIndex(embedder, max_rows=5)
    await nearest(database, index, "alice", "car")
    await nearest(database, index, "bob", "car")
    assert (index.held_rows("alice"), index.held_rows("bob")) == (2, 2)
    await nearest(database, index, "alice", "car")  # alice is now the most recent
    await nearest(database, index, "carol", "car")  # 6 rows: bob goes
    assert [index.held_rows(user) for user in ("alice", "bob", "carol")] == [2, 0, 2]
    await nearest(database, index, "bob", "car")  # read again: alice goes
    assert [index.held_rows(user) for user in ("alice", "bob", "carol")] == [0, 2, 2]
    # A forgotten user's rows no longer count; rows a user gains do.
    index.forget("bob")
    await make_session(database, "alice", ("user", "A vehicle."))
    await nearest(database, index, "alice", "car")
    assert [index.held_rows(user) for user in ("alice", "bob", "carol")] == [3, 0, 2]
    assert (await nearest(database, index, "bob", "car"))[0] == "My car."  # carol goes
    assert [index.held_rows(user) for user in ("alice", "bob", "carol")] == [3, 2, 0]


async def test_a_turns_vectors_read_only_its_own_entries_whatever_the_statistics(
    database: Database,
) -> None:
    """PostgreSQL prepares the statement and may plan it once for every session. While the
    table's statistics are off (never analyzed here), that plan must still reach the turn's
    entries through (session_id, seq), not through the 'turn' range of (kind, source_id),
    which holds every user's turns."""
    if database.is_sqlite:
        pytest.skip("PostgreSQL's generic plans")
    await make_user(database, "alice", "Alice")
    for _ in range(3):
        await make_session(database, "alice", *[("user", f"turn {n}") for n in range(20)])
    sql = _insert_turn(2, "postgresql")
    types = {"session_id": "text", "first": "int", "last": "int", "model": "text"}
    types |= {
        f"{name}_{row}": kind
        for row in range(2)
        for name, kind in (("seq", "int"), ("vector", "bytea"))
    }
    order = list(dict.fromkeys(re.findall(r"(?<![:\w]):(\w+)", sql)))
    numbered = re.sub(r"(?<![:\w]):(\w+)", lambda m: f"${order.index(m[1]) + 1}", sql)
    arguments = ", ".join(
        "'s'" if types[n] == "text" else "'\\x00'" if types[n] == "bytea" else "1" for n in order
    )
    async with database.session() as db:
        await db.execute(sql_text("SET LOCAL plan_cache_mode = force_generic_plan"))
        await db.execute(
            sql_text(f"PREPARE turn_vectors({', '.join(types[n] for n in order)}) AS {numbered}")
        )
        plan = "\n".join(
            (await db.execute(sql_text(f"EXPLAIN EXECUTE turn_vectors({arguments})"))).scalars()
        )
    assert "ix_recall_entries_session_seq" in plan
    assert "uq_recall_entries_kind" not in plan
    assert "seq >=" in plan


async def test_a_users_vectors_are_read_from_their_ids_whatever_the_statistics(
    database: Database,
) -> None:
    """Two users holding most rows between them: reading on, and reading back from the
    newest, for the one who wrote first must start from that user's ids in
    (user_id, model, kind, entry_id), not walk the vectors' primary key from the bound
    through every row the other wrote, on a plan made for these values or one made for any."""
    if database.is_sqlite:
        pytest.skip("PostgreSQL's planner")
    bulk = """
INSERT INTO recall_entries (user_id, session_id, kind, source_id, seq, speaker,
                            channel_type, body, occurred_at)
SELECT :user_id, :session_id, 'turn', :first + n, n, 'user', 'web', 'note ' || n, :at
FROM generate_series(1, 4000) AS n;
"""
    for first, user_id in ((0, "alice"), (10_000, "bob")):
        await make_user(database, user_id, user_id.title())
        session_id = await make_session(database, user_id)
        async with database.session() as db:
            await db.execute(
                sql_text(bulk),
                {"user_id": user_id, "session_id": session_id, "first": first, "at": T0},
            )
    async with database.session() as db:
        await db.execute(
            sql_text(
                "INSERT INTO recall_vectors (entry_id, user_id, kind, model, vector) "
                "SELECT id, user_id, kind, 'concepts-v1', '\\x00' FROM recall_entries"
            )
        )
    autocommit = database.engine.execution_options(isolation_level="AUTOCOMMIT")
    async with autocommit.connect() as conn:
        await conn.execute(sql_text("VACUUM ANALYZE recall_vectors"))
    reads = {
        "newer": ("(text, text, bigint)", _READ_NEWER, ":after"),
        "older": ("(text, text, bigint, bigint)", _READ_OLDER, ":before"),
    }
    async with database.session() as db:
        newest = (
            await db.execute(
                sql_text("SELECT max(entry_id) FROM recall_vectors WHERE user_id = 'alice'")
            )
        ).scalar_one()
        await db.execute(sql_text("SET LOCAL jit = off"))
        for (name, (types, statements, bound)), group in itertools.product(
            reads.items(), ("turns", "summaries")
        ):
            numbered = statements["postgresql", group].replace(":user_id", "$1")
            numbered = numbered.replace(":model", "$2").replace(bound, "$3")
            numbered = numbered.replace(":limit", "$4")
            arguments = (
                f"'alice', 'concepts-v1', {newest}"
                if name == "newer"
                else (f"'alice', 'concepts-v1', {2**62}, 10000")
            )
            await db.execute(sql_text(f"PREPARE {name}_{group}{types} AS {numbered}"))
            for mode in ("force_custom_plan", "force_generic_plan"):
                await db.execute(sql_text(f"SET LOCAL plan_cache_mode = {mode}"))
                explain = f"EXPLAIN EXECUTE {name}_{group}({arguments})"
                plan = "\n".join((await db.execute(sql_text(explain))).scalars())
                assert "Index Only Scan" in plan, plan
                assert "ix_recall_vectors_user_model_kind_entry" in plan, plan
                assert not re.search(r"Index Cond: \(entry_id [<>] ", plan), plan
                assert "Seq Scan" not in plan, plan
