"""Recall: query processing, the ranking ideas on top of BM25, what is left out because it is
already in context, the search tool, the passages a turn gets, and how far each search looks."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from sessions.recall import RecallSearch
from sessions.recall_query import query_terms
from sessions.recall_search import WHEN_CANDIDATES, OneSearch
from sessions.recall_tool import run_search_tool
from sessions.recall_values import (
    RecallBounds,
    RecallExclusions,
    RecallHit,
    RecallOptions,
)
from storage.database import Database
from storage.models import SessionSummary
from storage.recall_entries import SearchBound
from storage.recall_index import RecallIndexRepository
from storage.repositories.session_state import latest_active, read_state
from storage.repositories.sessions import SessionRepository
from storage.repositories.summaries import SummaryRepository
from storage.repositories.users import OrganizationRepository, UserRepository

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
PLAIN = RecallOptions(
    neighbour_weight=0, second_neighbour_weight=0, speaker_boost=0, summary_weight=0
)


async def conversation(
    database: Database, turns: list[tuple[str, str]], *, user_id: str = "alice", day: int = 0
) -> tuple[str, list[int]]:
    """A session of (speaker, text) turns; the first speaker is the user. Its id and the
    message row ids."""
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert(user_id, "acme", turns[0][0])
        sessions = SessionRepository(db)
        session = await sessions.create(user_id, "acme", at=T0 + timedelta(days=day))
        ids = []
        for index, (speaker, content) in enumerate(turns):
            row = await sessions.append_message(
                session.id,
                role="user" if speaker == turns[0][0] else "assistant",
                channel_type="web",
                content=content,
                at=T0 + timedelta(days=day, minutes=index),
                metadata={"speaker": speaker},
            )
            ids.append(row.id)
        return session.id, ids


def test_query_terms_are_lower_case_words_without_stopwords_or_repeats() -> None:
    assert query_terms("What did we decide about Acme's renewal? ACME, again!") == [
        "decide",
        "acme",
        "renewal",
    ]
    assert query_terms("Did you?") == []
    assert query_terms("Zürich_office 2026") == ["zürich", "office", "2026"]


async def test_an_empty_query_finds_nothing(database: Database) -> None:
    await conversation(database, [("Alice", "Anything at all")])
    assert await RecallSearch(database).search("alice", "what is it?") == []


async def test_the_turn_after_a_matching_question_is_found_through_its_neighbour(
    database: Database,
) -> None:
    _, ids = await conversation(
        database,
        [
            ("Alice", "Which supplier did the board pick for the warehouse robots?"),
            ("Bob", "Kuka, after the second round."),
            ("Alice", "Unrelated: lunch at noon."),
            ("Bob", "Sure."),
            ("Alice", "Robots again later."),
        ],
    )
    query = "supplier warehouse robots"
    plain = await RecallSearch(database, PLAIN).search("alice", query, 3, kinds=("turn",))
    assert ids[1] not in [hit.message_id for hit in plain]
    found = await RecallSearch(database).search("alice", query, 3, kinds=("turn",))
    assert [hit.message_id for hit in found][:2] == [ids[0], ids[1]]


async def test_turns_of_a_speaker_the_query_names_come_first(database: Database) -> None:
    _, ids = await conversation(
        database,
        [
            ("Caroline", "Melanie said hello."),
            ("Melanie", "I signed up for a pottery class."),
            ("Caroline", "Nice weather."),
            ("Melanie", "Indeed."),
        ],
    )
    plain = await RecallSearch(database, PLAIN).search("alice", "Melanie pottery", 2)
    assert {hit.message_id for hit in plain} == {ids[0], ids[1]}
    options = RecallOptions(neighbour_weight=0, second_neighbour_weight=0, summary_weight=0)
    found = await RecallSearch(database, options).search("alice", "Melanie pottery", 2)
    assert found[0].message_id == ids[1]
    assert found[0].speaker == "Melanie"


async def test_only_the_speaker_a_query_asks_about_is_boosted(database: Database) -> None:
    _, ids = await conversation(
        database,
        [
            ("Caroline", "Caroline recommends a book to Melanie."),
            ("Melanie", "I recommend a book by Le Guin."),
            *[("Caroline", f"The weather on day {day} was fine.") for day in range(4)],
        ],
    )
    query = "What book did Melanie recommend to Caroline?"
    plain = RecallOptions(neighbour_weight=0, second_neighbour_weight=0, summary_weight=0)
    either = await RecallSearch(database, replace(plain, speaker_roles=False)).search(
        "alice", query, 2
    )
    assert [hit.message_id for hit in either] == [ids[0], ids[1]]
    found = await RecallSearch(database, plain).search("alice", query, 2)
    assert [hit.message_id for hit in found] == [ids[1], ids[0]]


async def test_turns_written_on_a_date_the_query_names_come_first(database: Database) -> None:
    _, early = await conversation(database, [("Alice", "The logo is blue.")])
    _, late = await conversation(database, [("Alice", "The launch logo is green.")], day=10)
    await conversation(database, [("Alice", f"Lunch on day {day}.") for day in range(6)], day=20)
    query = f"Which logo did we pick for the launch on {T0:%d %B %Y}?"
    plain = RecallOptions(neighbour_weight=0, second_neighbour_weight=0, summary_weight=0)
    undated = await RecallSearch(database, replace(plain, date_boost=0)).search("alice", query, 2)
    assert [hit.message_id for hit in undated] == [late[0], early[0]]
    found = await RecallSearch(database, plain).search("alice", query, 2)
    assert [hit.message_id for hit in found] == [early[0], late[0]]


async def test_a_question_that_asks_when_puts_the_turn_that_says_when_first(
    database: Database,
) -> None:
    _, ids = await conversation(
        database,
        [
            ("Alice", "The app launch went well."),
            ("Alice", "The app launch was two weeks ago."),
            *[("Alice", f"Lunch on day {day}.") for day in range(6)],
        ],
    )
    plain = RecallOptions(neighbour_weight=0, second_neighbour_weight=0, summary_weight=0)
    found = await RecallSearch(database, plain).search("alice", "What about the app launch?", 2)
    assert [hit.message_id for hit in found] == [ids[0], ids[1]]
    query = "When was the app launch?"
    unboosted = await RecallSearch(database, replace(plain, when_boost=0)).search("alice", query, 2)
    assert [hit.message_id for hit in unboosted] == [ids[0], ids[1]]
    found = await RecallSearch(database, plain).search("alice", query, 2)
    assert [hit.message_id for hit in found] == [ids[1], ids[0]]
    assert found[0].text.startswith("The app launch was two weeks ago")


async def test_the_when_boost_looks_past_what_the_context_holds(database: Database) -> None:
    # The current session's turns rank first but are in the context: the turns the boost
    # weighs are the first ones the search can return.
    _, earlier = await conversation(
        database,
        [("Alice", "The app launch went well."), ("Alice", "The app launch was two weeks ago.")],
    )
    current, _ = await conversation(
        database, [("Alice", "App launch.") for _ in range(WHEN_CANDIDATES)], day=1
    )
    await conversation(database, [("Alice", f"Lunch on day {day}.") for day in range(6)], day=2)
    plain = RecallOptions(neighbour_weight=0, second_neighbour_weight=0, summary_weight=0)
    in_context = RecallExclusions(session_id=current)
    found = await RecallSearch(database, plain).search(
        "alice", "When was the app launch?", 2, kinds=("turn",), exclude=in_context
    )
    assert [hit.message_id for hit in found] == [earlier[1], earlier[0]]


async def test_a_matching_session_summary_lifts_that_sessions_turns(database: Database) -> None:
    first, first_ids = await conversation(database, [("Alice", "The budget is fine.")])
    _, second_ids = await conversation(database, [("Alice", "The budget is tight.")], day=1)
    async with database.session() as db:
        await SummaryRepository(db).add(
            SessionSummary(
                session_id=first,
                user_id="alice",
                summary="Alice reviewed the marketing budget.",
                created_at=T0,
            )
        )
    query = "marketing budget"
    plain = await RecallSearch(database, PLAIN).search("alice", query, 2, kinds=("turn",))
    assert {hit.message_id for hit in plain} == {first_ids[0], second_ids[0]}
    found = await RecallSearch(database).search("alice", query, 3)
    assert [hit.kind for hit in found].count("summary") == 1
    turns = [hit for hit in found if hit.kind == "turn"]
    assert turns[0].message_id == first_ids[0]


async def test_what_is_already_in_context_is_left_out(database: Database) -> None:
    old, old_ids = await conversation(database, [("Alice", "Acme price is 4200.")])
    current, current_ids = await conversation(
        database, [("Alice", "Acme kickoff notes."), ("Alice", "What was the Acme price?")], day=1
    )
    async with database.session() as db:
        await SummaryRepository(db).add(
            SessionSummary(session_id=old, user_id="alice", summary="Acme price", created_at=T0)
        )
    exclusions = RecallExclusions(session_id=current, after_seq=1, summary_sessions={old})
    found = await RecallSearch(database).search("alice", "Acme price", 10, exclude=exclusions)
    assert {hit.message_id for hit in found} == {old_ids[0], current_ids[0]}
    assert all(hit.kind == "turn" for hit in found)


async def test_a_search_with_only_the_context_to_search_reads_nothing_more(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    current, current_ids = await conversation(database, [("Alice", "Acme price is 4200.")])
    searches: list[str] = []
    original = OneSearch.find

    async def counted(self: OneSearch, exclusions: RecallExclusions) -> list[RecallHit]:
        searches.append(self.user_id)
        return await original(self, exclusions)

    monkeypatch.setattr(OneSearch, "find", counted)
    recall = RecallSearch(database)
    in_context = RecallExclusions(session_id=current)
    # All Alice ever said is the current session, all of it in the context.
    assert await recall.search("alice", "Acme price", 5, exclude=in_context) == []
    assert searches == []
    # Compacted, its older turns are not in the context any more: searched, and found.
    compacted = RecallExclusions(session_id=current, after_seq=1)
    found = await recall.search("alice", "Acme price", 5, exclude=compacted)
    assert [hit.message_id for hit in found] == current_ids
    assert searches == ["alice"]
    # Once she has another session, its turns are found (and she is remembered).
    _, later_ids = await conversation(database, [("Alice", "Acme price is 4300 now.")], day=1)
    found = await recall.search("alice", "Acme price", 5, exclude=in_context)
    assert [hit.message_id for hit in found] == later_ids
    assert await recall.search("alice", "Acme price", 5, exclude=in_context) == found
    assert searches == ["alice"] * 3


async def test_the_sessions_state_tells_the_search_whether_anything_else_is_indexed(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, first_ids = await conversation(database, [("Alice", "Acme price is 4200.")])

    async def no_lookup(*_args: object) -> bool:
        raise AssertionError("the state read already told")

    monkeypatch.setattr(RecallIndexRepository, "has_entries_outside", no_lookup)
    recall = RecallSearch(database)
    async with database.session() as db:
        only = await latest_active(db, "alice")
    assert only is not None
    assert only.id == first
    assert only.others_indexed is False
    alone = RecallExclusions(session_id=first, others_indexed=only.others_indexed)
    assert await recall.search("alice", "Acme price", 5, exclude=alone) == []
    second, _ = await conversation(database, [("Alice", "Anything new?")], day=1)
    async with database.session() as db:
        latest = await latest_active(db, "alice")
        by_id = await read_state(db, first)
    assert latest is not None
    assert latest.id == second
    assert latest.others_indexed is True
    assert by_id is not None
    assert by_id.others_indexed is True
    later = RecallExclusions(session_id=second, others_indexed=latest.others_indexed)
    found = await recall.search("alice", "Acme price", 5, exclude=later)
    assert [hit.message_id for hit in found] == first_ids


async def test_the_search_tool_answers_with_dated_passages(database: Database) -> None:
    await conversation(database, [("Alice", "The Acme renewal is 4200 euros.")])
    await conversation(database, [("Alice", "Acme called again about the renewal.")], day=10)
    recall = RecallSearch(database)
    answer = await run_search_tool(recall, {"query": "Acme renewal"}, "alice")
    assert answer.startswith("2 passage(s)")
    assert "2026-03-02 Alice" in answer
    dated = await run_search_tool(
        recall, {"query": "Acme renewal", "until": "2026-03-02", "limit": 5}, "alice"
    )
    assert "4200 euros" in dated
    assert "called again" not in dated
    assert "Nothing" in await run_search_tool(recall, {"query": "zeppelin"}, "alice")
    assert "Nothing" in await run_search_tool(recall, {"query": "Acme"}, "bob")
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        await run_search_tool(recall, {"query": "Acme", "since": "last week"}, "alice")
    with pytest.raises(ValueError, match="query"):
        await run_search_tool(recall, {}, "alice")


def test_reference_coverage_counts_the_messages_words_found_in_a_summary() -> None:
    from sessions.recall_reference import reference_coverage  # noqa: PLC0415

    summary = "Alice and the assistant agreed the Acme renewals at 4200 euros per seat."
    # acme, renewal ~ renewals, per, seat of acme, renewal, price, per, seat
    assert reference_coverage("About the Acme renewal: the price per seat?", summary) == (4, 0.8)
    assert reference_coverage("a book about volcanoes", summary) == (0, 0.0)
    assert reference_coverage("the and of", summary) == (0, 0.0)


async def test_the_automatic_search_is_bounded_and_the_tool_searches_further(
    database: Database,
) -> None:
    _, old = await conversation(
        database, [("Alice", "Kuka robots arrive in March."), ("Alice", "Warehouse budget.")]
    )
    for day in range(1, 4):
        recent = [
            ("Alice", f"The warehouse budget and the robot schedule, {n}.") for n in range(15)
        ]
        await conversation(database, recent, day=day)
    bound = SearchBound(window=20, rare_postings=3, max_terms=4)
    recall = RecallSearch(database, replace(PLAIN, automatic=RecallBounds(bound, bound)))

    # A rare word is found however far back it was said ...
    found = await recall.search("alice", "When do the Kuka robots arrive?", 3)
    assert found[0].message_id == old[0]
    # ... but the common words of every turn are looked up in the recent window only: the old
    # two-word turn that matches best is out of the automatic search's reach.
    found = await recall.search("alice", "warehouse budget", 5, kinds=("turn",))
    assert old[1] not in [hit.message_id for hit in found]
    assert len(found) == 5
    # The tool, asked for by the model, searches further.
    answer = await run_search_tool(recall, {"query": "warehouse budget", "limit": 1}, "alice")
    assert "Warehouse budget." in answer
