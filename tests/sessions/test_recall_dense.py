"""Dense recall: the packaged embedding model loads from what is installed (no network), puts
texts about the same thing near each other, and costs well under the indexing budget; the
hybrid search finds a passage that shares no word with the question, and the fusion of the
full-text and vector rankings keeps what either found."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import storage.vector_index
from sessions.compaction import CompactionPolicy, Compactor
from sessions.engine import SessionEngine
from sessions.engine_values import EngineSettings, RecallSettings
from sessions.llm import OfflineLLM
from sessions.recall import RecallSearch
from sessions.recall_embedding import installed_embedder, model_files
from sessions.recall_query import without_names
from sessions.recall_ranking import fuse_ranks, fuse_scores
from sessions.recall_values import RecallOptions
from storage import driver_rows
from storage.database import Database
from storage.local_transcripts import LocalTranscriptStore
from storage.recall_entries import IndexedText
from storage.repositories.sessions import SessionRepository
from storage.vector_index import Scorer, VectorIndex
from tests.sessions.test_recall import conversation

needs_model = pytest.mark.skipif(model_files() is None, reason="the recall model is not installed")
AT = datetime(2026, 3, 2, tzinfo=UTC)


def entry(entry_id: int, score: float) -> IndexedText:
    return IndexedText(entry_id, "s", "turn", entry_id, entry_id, "a", "web", AT, score)


def test_rank_fusion_adds_reciprocal_ranks() -> None:
    fused = fuse_ranks([([entry(1, 9.0), entry(2, 5.0)], 1.0), ([entry(2, 0.9)], 1.0)], k=60)
    assert [e.entry_id for e in fused] == [2, 1]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)


def test_score_fusion_keeps_the_full_text_scale_and_adds_what_vectors_found() -> None:
    full_text = [entry(1, 10.0), entry(2, 6.0), entry(3, 2.0)]
    vectors = [entry(3, 0.8), entry(4, 0.7), entry(1, 0.2)]
    fused = {e.entry_id: e.score for e in fuse_scores([(full_text, 1.0), (vectors, 0.5)])}
    assert fused[1] == pytest.approx(10.0)  # best words, worst vector: its words' score
    assert fused[3] == pytest.approx(10.0 * 0.5)  # worst words, best vector
    assert fused[4] == pytest.approx(10.0 * 0.5 * (0.5 / 0.6))
    assert fused[2] == pytest.approx(10.0 * 0.5)


def test_the_question_is_embedded_without_the_speakers_names() -> None:
    asked = "What books has Melanie read? Did Melanie\u2019s kids like Caroline's?"
    assert without_names(asked, ["Melanie", "Caroline Smith"]) == (
        "What books has  read? Did  kids like ?"
    )
    assert without_names(asked, []) == asked
    assert without_names("Melanies and Mel", ["Mel"]) == "Melanies and "


@needs_model
def test_the_model_loads_offline_and_puts_paraphrases_near(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    embedder = installed_embedder()
    assert embedder is not None
    vectors = embedder.embed(
        ["My dog loves running in the park.", "The puppy plays outside.", "Tax reform bill."]
    )
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2


@needs_model
def test_embedding_a_message_costs_far_less_than_the_indexing_budget() -> None:
    embedder = installed_embedder()
    assert embedder is not None
    message = "Hey, how did the support group meeting go yesterday? I went to a painting class."
    started = time.process_time()
    for _ in range(200):
        embedder.embed([message])
    assert (time.process_time() - started) / 200 < 0.002


@needs_model
async def test_the_hybrid_search_finds_a_passage_by_meaning(database: Database) -> None:
    embedder = installed_embedder()
    assert embedder is not None
    database.use_embedder(embedder)
    _, ids = await conversation(
        database,
        [
            ("Alice", "My puppy chewed through the sofa cushions again."),
            ("assistant", "Oh no, that sounds frustrating."),
            ("Alice", "The quarterly tax filing is due next week."),
            ("assistant", "Good luck with the spreadsheets."),
        ],
    )
    question = "which pet damaged the couch?"
    full_text = await RecallSearch(database, RecallOptions(dense=False)).search(
        "alice", question, 3, kinds=("turn",)
    )
    assert full_text == []  # no word in common: words alone find nothing
    hybrid = RecallSearch(database, vectors=VectorIndex(embedder))
    found = await hybrid.search("alice", question, 3, kinds=("turn",))
    assert found[0].message_id == ids[0]


@needs_model
async def test_switching_dense_recall_off_stops_embedding_and_vector_search(
    database: Database, tmp_path: Path
) -> None:
    policy = CompactionPolicy(budget_tokens=50_000)
    llm = OfflineLLM()
    on = RecallSettings()
    engine = SessionEngine(
        database,
        Compactor(database, LocalTranscriptStore(tmp_path), llm, policy, clock=lambda: AT),
        llm,
        EngineSettings(system_prompt="Be brief.", max_tokens=500, compaction=policy),
        clock=lambda: AT,
        recall=on,
        embedder=installed_embedder(),
    )
    assert database.embedder is engine.embedder
    assert engine.recall is not None
    assert engine.recall.vectors is engine.vectors
    engine.reconfigure(engine.settings, replace(on, options=RecallOptions(dense=False)))
    assert database.embedder is None
    assert engine.recall.vectors is None
    engine.reconfigure(engine.settings, on)
    assert database.embedder is engine.embedder
    assert engine.recall.vectors is engine.vectors


@needs_model
async def test_a_hit_deleted_after_the_vectors_were_read_is_left_out_and_the_next_taken(
    database: Database,
) -> None:
    embedder = installed_embedder()
    assert embedder is not None
    database.use_embedder(embedder)
    gone, _ = await conversation(
        database, [("Alice", "My puppy chewed through the sofa cushions again.")]
    )
    _, kept = await conversation(
        database, [("Alice", "The kitten scratched the armchair to shreds.")], day=1
    )
    index = VectorIndex(embedder)
    hybrid = RecallSearch(database, vectors=index)
    question = "which pet damaged the couch?"
    first = await hybrid.search("alice", question, 2, kinds=("turn",))
    assert [hit.session_id for hit in first][:1] == [gone]
    assert len(first) == 2
    # The vector index still holds the deleted session's turn: its text is gone, so it is
    # no hit, and the next candidate takes its place.
    async with database.session() as db:
        assert await SessionRepository(db).delete(gone)
    transactions = []
    reading = database.driver_reading

    @contextlib.asynccontextmanager
    async def counted() -> AsyncIterator[driver_rows.DriverScope]:
        async with reading() as scope:
            transactions.append(scope)
            yield scope

    database.driver_reading = counted  # type: ignore[method-assign]
    found = await hybrid.search("alice", question, 1, kinds=("turn",))
    assert [hit.message_id for hit in found] == kept
    # Two read-only transactions side by side; the second to end ranks and reads the texts.
    assert len(transactions) == 2
    assert transactions[0] is not transactions[1]


@needs_model
async def test_the_turns_vectors_are_scored_off_the_event_loop_with_the_same_hits(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedder = installed_embedder()
    assert embedder is not None
    database.use_embedder(embedder)
    await conversation(
        database,
        [
            ("Alice", "My puppy chewed through the sofa cushions again."),
            ("assistant", "Oh no, that sounds frustrating."),
            ("Alice", "The quarterly tax filing is due next week."),
        ],
    )
    question = "which pet damaged the couch?"
    inline = await RecallSearch(database, vectors=VectorIndex(embedder)).search("alice", question)
    scored_in: list[int] = []
    nearest = Scorer.nearest

    def recorded(scorer: Scorer, *args: Any) -> list[IndexedText]:
        scored_in.append(threading.get_ident())
        return nearest(scorer, *args)

    monkeypatch.setattr(Scorer, "nearest", recorded)
    monkeypatch.setattr(storage.vector_index, "_OVERLAPPED", 1)  # a user this small too
    apart = await RecallSearch(database, vectors=VectorIndex(embedder)).search("alice", question)
    assert apart == inline
    loop = threading.get_ident()
    assert loop in scored_in  # the few summaries', on the event loop
    assert any(thread != loop for thread in scored_in)  # the turns', in a worker thread
