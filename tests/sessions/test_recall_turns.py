"""Recall inside a turn: the context's reads say whether anything else could be found, the
search runs after the reading transaction, and its passages join the context within the cap."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from sessions.compaction import CompactionPolicy, Compactor
from sessions.context import EARLIER_HEADING
from sessions.engine import SessionEngine
from sessions.engine_values import ContextReads, EngineSettings, RecallSettings
from sessions.llm import OfflineLLM
from sessions.recall_search import IndexQuery
from sessions.recall_tool import SEARCH_TOOL_NAME
from storage import driver_rows
from storage.database import Database
from storage.local_transcripts import LocalTranscriptStore
from storage.recall_entries import TURN
from storage.recall_index import RecallIndexReads, RecallIndexRepository
from storage.repositories.session_state import insert_session, read_state
from tests.sessions.test_recall import T0, conversation
from tests.statements import recorded_statements


def engine(database: Database, tmp_path: Path, recall: RecallSettings | None) -> SessionEngine:
    policy = CompactionPolicy(budget_tokens=50_000)
    llm = OfflineLLM()
    return SessionEngine(
        database,
        Compactor(database, LocalTranscriptStore(tmp_path), llm, policy, clock=lambda: T0),
        llm,
        EngineSettings(system_prompt="Be brief.", max_tokens=500, compaction=policy),
        clock=lambda: T0 + timedelta(days=30),
        recall=recall,
    )


async def test_the_search_runs_after_the_turns_transaction_and_a_failure_leaves_it_out(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await conversation(database, [("Alice", "Acme invoice number 7 was paid.")], day=0)
    current, _ = await conversation(database, [("Alice", "Was the Acme invoice paid?")], day=7)
    subject = engine(database, tmp_path, RecallSettings(auto_hits=3))
    async with database.session() as db:
        session = await read_state(db, current)
        assert session is not None
        reads = await subject.read_context(db, session)
    # Nothing is searched in the caller's transaction; the passages come after it.
    assert reads.earlier == ()
    found = await subject.with_earlier(reads)
    assert [excerpt.text for excerpt in found.earlier] == ["Acme invoice number 7 was paid."]

    async def broken(self: IndexQuery, index: RecallIndexReads, *_: object) -> None:
        if self.kinds != (TURN,):
            await driver_rows.rows(index.scope, "SELECT * FROM no_such_table", {})
        # The turns' half fails too, later, with its connection in hand meanwhile.
        await driver_rows.rows(index.scope, "SELECT 1", {})
        await asyncio.sleep(0.2)
        await driver_rows.rows(index.scope, "SELECT * FROM no_such_table", {})

    monkeypatch.setattr(IndexQuery, "run", broken)
    failed = await subject.with_earlier(reads)
    # The other half ended with the search: none is left running, holding a connection.
    assert database.connections_in_use() == 0
    context = subject.context_from(failed).context
    assert EARLIER_HEADING not in context.request.system
    assert failed.earlier == ()


async def test_a_long_passage_shows_the_part_that_answers(
    database: Database, tmp_path: Path
) -> None:
    filler = "We went through the quarterly numbers and the vendor contract again today. " * 8
    said = filler + "The Halvorsen renewal still waits for their procurement sign-off."
    await conversation(database, [("Alice", said)], day=0)
    current, _ = await conversation(database, [("Alice", "Where is the Halvorsen renewal?")], day=7)
    subject = engine(database, tmp_path, RecallSettings(auto_hits=3, excerpt_chars=200))
    async with database.session() as db:
        session = await read_state(db, current)
        assert session is not None
        found = await subject.with_earlier(await subject.read_context(db, session))
    # The name is in the passage's last sentence, 600 characters in: that is what is shown.
    (shown,) = [excerpt.text for excerpt in found.earlier]
    assert shown.endswith("The Halvorsen renewal still waits for their procurement sign-off.")
    assert shown.startswith("…")
    assert len(shown) <= 200


async def test_a_state_without_the_answer_is_looked_up_in_the_reading_transaction(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session just created or reactivated (its state made from the row, not read with
    the answer): whether the user has other entries is read with the context, in the caller's
    transaction, and the search after it looks nothing up in one of its own."""
    first, _ = await conversation(database, [("Alice", "Acme invoice number 7 was paid.")])
    lookups: list[AsyncSession] = []
    original = RecallIndexRepository.has_entries_outside

    async def counted(self: RecallIndexRepository, user_id: str, session_id: str) -> bool:
        lookups.append(self.session)
        return await original(self, user_id, session_id)

    monkeypatch.setattr(RecallIndexRepository, "has_entries_outside", counted)
    subject = engine(database, tmp_path, RecallSettings(auto_hits=3))

    async def turn_reads(session_id: str) -> tuple[AsyncSession, ContextReads]:
        async with database.session() as db:
            state = await read_state(db, session_id)
            assert state is not None
            as_made = replace(state, others_indexed=None)
            return db, await subject.read_context(db, as_made)

    db, alone = await turn_reads(first)
    assert alone.exclusions.others_indexed is False
    assert lookups == [db]
    assert (await subject.with_earlier(alone)).earlier == ()
    assert lookups == [db]  # the search knew
    second, _ = await conversation(database, [("Alice", "Was the Acme invoice paid?")], day=7)
    db, later = await turn_reads(second)
    assert later.exclusions.others_indexed is True
    found = await subject.with_earlier(later)
    assert [excerpt.text for excerpt in found.earlier] == ["Acme invoice number 7 was paid."]
    assert lookups[1:] == [db]
    # Known from then on: nothing is looked up again for her.
    await turn_reads(second)
    assert len(lookups) == 2
    # With no search at each turn, nothing is looked up at all.
    quiet = engine(database, tmp_path, RecallSettings(auto_hits=0))
    async with database.session() as db:
        state = await read_state(db, first)
        assert state is not None
        reads = await quiet.read_context(db, replace(state, others_indexed=None))
    assert reads.exclusions.others_indexed is None
    assert len(lookups) == 2


async def test_a_new_sessions_insert_says_whether_the_user_has_entries_elsewhere(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The INSERT of a new session returns the answer, so the turn's context reads and its
    search look nothing up for it."""
    await conversation(database, [("Alice", "Acme invoice number 7 was paid.")])
    await conversation(database, [("Bob", "Hello.")], user_id="bob")
    async with database.session() as db:
        await db.execute(text("DELETE FROM recall_entries WHERE user_id = 'bob'"))
    looked_up: list[str] = []
    original = RecallIndexRepository.has_entries_outside

    async def counted(self: RecallIndexRepository, user_id: str, session_id: str) -> bool:
        looked_up.append(user_id)
        return await original(self, user_id, session_id)

    monkeypatch.setattr(RecallIndexRepository, "has_entries_outside", counted)
    subject = engine(database, tmp_path, RecallSettings(auto_hits=3))
    for user_id, expected in (("alice", True), ("bob", False)):
        async with database.statement(writes=True) as scope:
            state = await insert_session(scope, user_id, "acme", at=T0 + timedelta(days=1))
        assert state.others_indexed is expected
        async with database.lookups() as db:
            reads = await subject.read_context(db, state)
        assert reads.exclusions.others_indexed is expected
        await subject.with_earlier(reads)
    assert looked_up == []


async def test_a_turn_gets_passages_from_earlier_conversations_within_the_cap(
    database: Database, tmp_path: Path
) -> None:
    for day in range(6):
        await conversation(database, [("Alice", f"Acme invoice number {day} was paid.")], day=day)
    current, _ = await conversation(database, [("Alice", "Was the Acme invoice paid?")], day=7)

    context, _ = await engine(database, tmp_path, RecallSettings(auto_hits=3)).assemble_context(
        current
    )
    system = context.request.system
    assert EARLIER_HEADING in system
    passages = system.split(EARLIER_HEADING, 1)[1].strip().splitlines()
    assert len(passages) == 3
    assert all("Acme invoice number" in line and "Alice" in line for line in passages)
    assert SEARCH_TOOL_NAME in {tool.name for tool in context.request.tools}

    capped = engine(database, tmp_path, RecallSettings(auto_hits=5, auto_context_tokens=30))
    context, _ = await capped.assemble_context(current)
    assert len(context.request.system.split(EARLIER_HEADING, 1)[1].strip().splitlines()) == 1

    context, _ = await engine(database, tmp_path, None).assemble_context(current)
    assert EARLIER_HEADING not in context.request.system
    assert not context.request.tools


async def test_a_context_is_read_beside_a_writer_without_a_transaction_of_its_own(
    database: Database, tmp_path: Path
) -> None:
    """`load_context` reads as a turn reads: on SQLite it takes no write lock, so a writer in
    the middle of its transaction does not hold it up (on PostgreSQL a writer never holds a
    reader up)."""
    await conversation(database, [("Alice", "Acme invoice number 7 was paid.")], day=0)
    current, _ = await conversation(database, [("Alice", "Was the Acme invoice paid?")], day=7)
    subject = engine(database, tmp_path, RecallSettings(auto_hits=3))
    writing, done = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with database.session() as db:
            await db.execute(text("UPDATE sessions SET updated_at = updated_at"))
            writing.set()
            await done.wait()

    held = asyncio.create_task(writer())
    await writing.wait()
    try:
        with recorded_statements(database) as statements:
            loaded = await asyncio.wait_for(subject.load_context(current), timeout=3)
    finally:
        done.set()
        await held
    assert "Acme invoice number 7 was paid." in loaded.context.request.system
    assert not [s for s in statements if "IMMEDIATE" in s.upper()]
