"""The recall index is kept in step by the database: written with every turn and summary,
gone with its session or user, rebuilt on request; searches never cross users, and examine a
bounded share of a user's history: the recent window, and rare words anywhere."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, text, update

from storage.database import Database
from storage.models import Session, SessionCompaction, SessionMessage, SessionSummary
from storage.recall_entries import COMPACTION, SUMMARY, TURN, SearchBound
from storage.recall_index import RecallIndexReads, RecallIndexRepository, merge_full_text
from storage.repositories.compactions import CompactionRepository
from storage.repositories.session_state import read_state
from storage.repositories.sessions import SessionRepository
from storage.repositories.summaries import SummaryRepository
from storage.repositories.users import OrganizationRepository, UserRepository

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


async def make_user(database: Database, user_id: str, name: str) -> None:
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert(user_id, "acme", name)


async def make_session(database: Database, user_id: str, *messages: tuple[str, str]) -> str:
    """A session of `user_id` with (role, content) messages, one minute apart."""
    async with database.session() as db:
        sessions = SessionRepository(db)
        session = await sessions.create(user_id, "acme", at=T0)
        for index, (role, content) in enumerate(messages):
            await sessions.append_message(
                session.id,
                role=role,
                channel_type="web",
                content=content,
                at=T0 + timedelta(minutes=index),
            )
        return session.id


async def search(
    database: Database, user_id: str, *terms: str, kinds: tuple[str, ...] = (TURN,), **kw: object
) -> list[str]:
    async with database.session() as db:
        index = RecallIndexRepository(db)
        found = await index.search(user_id, terms, kinds=kinds, **kw)  # type: ignore[arg-type]
        texts = await index.texts(user_id, [entry.entry_id for entry in found.entries])
    return [texts[entry.entry_id] for entry in found.entries]


async def test_every_turn_is_indexed_with_its_speaker_when_written(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    session_id = await make_session(
        database,
        "alice",
        ("user", "We decided to renew the Acme contract in May."),
        ("assistant", "Noted: the Acme renewal is due in May."),
        ("tool", "tool output is not a turn"),
        ("user", "   "),
    )
    async with database.session() as db:
        await SessionRepository(db).append_message(
            session_id,
            role="user",
            channel_type="email",
            content="Forwarding Priya's note on Acme.",
            at=T0 + timedelta(hours=1),
            metadata={"speaker": "Priya"},
        )
    async with database.session() as db:
        found = (await RecallIndexRepository(db).search("alice", ["acme"], kinds=(TURN,))).entries
        assert await RecallIndexRepository(db).count("alice") == 3
    assert {(entry.speaker, entry.seq, entry.channel_type) for entry in found} == {
        ("Alice", 1, "web"),
        ("assistant", 2, "web"),
        ("Priya", 5, "email"),
    }
    assert all(entry.session_id == session_id and entry.kind == TURN for entry in found)
    assert found[0].occurred_at.tzinfo is not None


async def test_stemming_or_semantics_and_ranking_by_bm25(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    await make_session(
        database,
        "alice",
        ("user", "The invoices were renewed yesterday."),
        ("assistant", "Good to hear about the weather."),
        ("user", "Acme invoice renewal: done."),
        ("user", "Renewing nothing else."),
    )
    found = await search(database, "alice", "invoice", "renewal", "acme")
    assert found[:2] == ["Acme invoice renewal: done.", "The invoices were renewed yesterday."]
    assert "Renewing nothing else." in found  # any one word is enough
    assert "Good to hear about the weather." not in found


async def test_search_never_returns_another_users_entries(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    await make_user(database, "bob", "Bob")
    await make_session(database, "alice", ("user", "Alice's secret: the Acme budget is 9000."))
    await make_session(database, "bob", ("user", "Bob's note on the Acme budget."))
    assert await search(database, "bob", "acme", "budget", "secret") == [
        "Bob's note on the Acme budget."
    ]
    assert await search(database, "carol", "acme") == []


async def test_session_and_compaction_summaries_are_indexed_too(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    session_id = await make_session(database, "alice", ("user", "hello"))
    async with database.session() as db:
        await SummaryRepository(db).add(
            SessionSummary(
                session_id=session_id,
                user_id="alice",
                summary="Alice planned the Zurich offsite.",
                created_at=T0,
            )
        )
        await CompactionRepository(db).add(
            SessionCompaction(
                session_id=session_id,
                seq=1,
                first_message_seq=1,
                last_message_seq=1,
                messages_compacted=1,
                tokens_before=10,
                tokens_after=5,
                archive_ref="x",
                summary="- Zurich offsite budget approved",
                created_at=T0,
            )
        )
    async with database.session() as db:
        found = (
            await RecallIndexRepository(db).search("alice", ["zurich"], kinds=(SUMMARY, COMPACTION))
        ).entries
    assert sorted(entry.kind for entry in found) == [COMPACTION, SUMMARY]
    assert await search(database, "alice", "zurich") == []  # turns only


async def test_a_changed_message_is_indexed_again(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    await make_session(database, "alice", ("user", "The launch is on Monday."))
    async with database.session() as db:
        await db.execute(update(SessionMessage).values(content="The launch moved to Friday."))
    assert await search(database, "alice", "monday") == []
    assert await search(database, "alice", "friday") == ["The launch moved to Friday."]


async def test_time_bounds_keep_to_when_it_was_said(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    await make_session(database, "alice", ("user", "Acme one"), ("user", "Acme two"))
    later = T0 + timedelta(minutes=1)
    assert await search(database, "alice", "acme", since=later) == ["Acme two"]
    assert await search(database, "alice", "acme", until=later) == ["Acme one"]


async def test_deleting_a_session_or_user_removes_their_entries(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    await make_user(database, "bob", "Bob")
    gone = await make_session(database, "alice", *[("user", f"Acme item {n}") for n in range(30)])
    await make_session(database, "alice", ("user", "Acme stays"))
    await make_session(database, "bob", ("user", "Acme for Bob"))
    async with database.session() as db:
        await SummaryRepository(db).add(
            SessionSummary(session_id=gone, user_id="alice", summary="Acme items", created_at=T0)
        )
    async with database.session() as db:
        assert await SessionRepository(db).delete(gone)
    assert await search(database, "alice", "acme", kinds=(TURN, SUMMARY)) == ["Acme stays"]
    async with database.session() as db:
        assert await RecallIndexRepository(db).count("alice") == 1
        assert await UserRepository(db).delete("bob")
    async with database.session() as db:
        assert await RecallIndexRepository(db).count("bob") == 0
        statistics = text("SELECT user_id, kind, documents FROM recall_stats WHERE term = ''")
        stats = (await db.execute(statistics)).all()
        assert sorted(stats) == [("alice", "summary", 0), ("alice", "turn", 1)]
        if not database.is_sqlite:
            lexemes = text("SELECT kind, term, documents FROM recall_stats WHERE term <> ''")
            assert sorted((await db.execute(lexemes)).all()) == [
                ("turn", "acm", 1),
                ("turn", "stay", 1),
            ]
    assert await search(database, "bob", "acme") == []


async def test_reindex_rebuilds_what_went_missing(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    await make_session(database, "alice", ("user", "Acme one"), ("assistant", "Acme two"))
    async with database.session() as db:
        await db.execute(text("DELETE FROM recall_entries"))
    assert await search(database, "alice", "acme") == []
    async with database.session() as db:
        assert await RecallIndexRepository(db).rebuild() == 2
    assert sorted(await search(database, "alice", "acme")) == ["Acme one", "Acme two"]
    async with database.session() as db:
        assert await RecallIndexRepository(db).rebuild() == 2  # idempotent
        if database.is_sqlite:
            await db.execute(text("INSERT INTO recall_fts(recall_fts) VALUES ('integrity-check')"))
        statistics = text("SELECT documents FROM recall_stats WHERE term = ''")
        assert list((await db.execute(statistics)).scalars()) == [2]


# --- the bound: what one search may examine -------------------------------------------------

SMALL = SearchBound(window=40, rare_postings=5, max_terms=3)
COMMON = "the quarterly report numbers for the vendor contract look fine"


async def add_history(database: Database, user_id: str, turns: list[str], *, day: int) -> str:
    """A session of `user_id` holding `turns` (alternating user and assistant), in bulk."""
    async with database.session() as db:
        session = await SessionRepository(db).create(user_id, "acme", at=T0)
        start = T0 + timedelta(days=day)
        await db.execute(
            insert(SessionMessage),
            [
                {
                    "session_id": session.id,
                    "seq": index + 1,
                    "role": "user" if index % 2 == 0 else "assistant",
                    "channel_type": "web",
                    "thread_id": "",
                    "content": content,
                    "tokens": 0,
                    "created_at": start + timedelta(seconds=index),
                    "metadata": {},
                }
                for index, content in enumerate(turns)
            ],
        )
        await db.execute(
            update(Session).where(Session.id == session.id).values(last_seq=len(turns))
        )
        return session.id


async def bounded(
    database: Database, *terms: str, bound: SearchBound = SMALL
) -> tuple[list[str], int]:
    async with database.session() as db:
        index = RecallIndexRepository(db)
        found = await index.search("alice", terms, kinds=(TURN,), limit=10, bound=bound)
        texts = await index.texts("alice", [entry.entry_id for entry in found.entries])
    return [texts[entry.entry_id] for entry in found.entries], found.examined


async def test_a_search_examines_no_more_than_its_bound_however_long_the_history(
    database: Database,
) -> None:
    await make_user(database, "alice", "Alice")
    await add_history(database, "alice", ["Zeppelin tickets booked for Priya."], day=0)
    examined = []
    for day in range(1, 4):
        await add_history(database, "alice", [f"{COMMON} ({n})" for n in range(200)], day=day)
        found, scored = await bounded(database, "zeppelin", "quarterly", "vendor")
        # The rare word is found at the very start of the history, behind 200-600 common turns.
        assert found[0] == "Zeppelin tickets booked for Priya."
        examined.append(scored)
    assert max(examined) <= SMALL.most_examined
    assert examined == [examined[0]] * 3  # the same work for 201, 401 and 601 turns


async def test_common_words_are_looked_up_in_the_recent_window_only(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    await add_history(database, "alice", ["An old note on the quarterly vendor budget."], day=0)
    await add_history(database, "alice", [f"{COMMON} ({n})" for n in range(100)], day=1)
    found, examined = await bounded(database, "budget", "quarterly")
    # "budget" is rare and found anywhere; "quarterly" is common: its old turns are not read,
    # so an old turn holding only common words is left out ...
    assert found[0] == "An old note on the quarterly vendor budget."
    found, _ = await bounded(database, "quarterly", "vendor")
    assert "An old note on the quarterly vendor budget." not in found
    assert examined <= SMALL.most_examined
    # ... unless the window reaches it.
    found, _ = await bounded(database, "quarterly", "vendor", bound=SearchBound(window=200))
    assert "An old note on the quarterly vendor budget." in found


async def test_a_history_no_longer_than_the_window_is_searched_completely(
    database: Database,
) -> None:
    await make_user(database, "alice", "Alice")
    await add_history(database, "alice", [f"{COMMON} ({n})" for n in range(30)], day=0)
    await add_history(database, "alice", ["Vendor call moved; the report is late."], day=1)
    small, _ = await bounded(database, "vendor", "report", "late")
    everything, _ = await bounded(
        database, "vendor", "report", "late", bound=SearchBound(window=10_000)
    )
    assert small == everything
    assert small[0] == "Vendor call moved; the report is late."


async def test_only_the_rarest_words_are_searched(database: Database) -> None:
    await make_user(database, "alice", "Alice")
    await add_history(database, "alice", [f"{COMMON} ({n})" for n in range(20)], day=0)
    await add_history(database, "alice", ["Pottery class on Friday."], day=1)
    one_word = SearchBound(window=40, rare_postings=5, max_terms=1)
    found, _ = await bounded(database, "report", "quarterly", "pottery", bound=one_word)
    assert found == ["Pottery class on Friday."]  # the common words were not searched


async def test_merging_the_full_text_segments_finds_the_same_and_ends(database: Database) -> None:
    """Turns written a transaction each leave SQLite's full-text index in many segments
    (searched several times slower); merged step by step into one, every search finds the
    same. PostgreSQL has nothing to merge."""
    await make_user(database, "alice", "Alice")
    for day in range(30):
        await make_session(
            database,
            "alice",
            ("user", f"Is the Acme renewal number {day} signed?"),
            ("assistant", f"Renewal {day} is signed; the invoice follows."),
        )
    before = await search(database, "alice", "renewal", "invoice", "acme", limit=100)
    steps = await merge_full_text(database, pages=4)
    async with database.session() as db:
        left = await RecallIndexRepository(db).merge_step()
    if database.is_sqlite:
        assert steps >= 1
    else:
        assert steps == 0
    assert not left
    assert await search(database, "alice", "renewal", "invoice", "acme", limit=100) == before
    assert len(before) == 60


async def test_the_turns_next_to_a_position_skip_what_is_not_indexed_and_stay_in_the_session(
    database: Database,
) -> None:
    await make_user(database, "alice", "Alice")
    await make_user(database, "bob", "Bob")
    # seq 1-8; the tool call and result (seq 4, 5) are not indexed turns.
    first = await make_session(
        database,
        "alice",
        ("user", "one"),
        ("assistant", "two"),
        ("user", "three"),
        ("tool", "a tool call"),
        ("tool", "a tool result"),
        ("assistant", "six"),
        ("user", "seven"),
        ("assistant", "eight"),
    )
    second = await make_session(database, "alice", ("user", "other one"), ("user", "other two"))
    bobs = await make_session(database, "bob", ("user", "bob one"), ("user", "bob two"))

    async def next_to(user_id: str, *positions: tuple[str, int], per_side: int = 2) -> list[str]:
        async with database.session() as db:
            index = RecallIndexRepository(db)
            found = await index.neighbours(user_id, positions, per_side=per_side)
            texts = await index.texts(user_id, [entry.entry_id for entry in found])
        assert [(e.session_id, e.seq) for e in found] == sorted(
            (e.session_id, e.seq) for e in found
        )
        return [texts[entry.entry_id] for entry in found]

    # Two on each side of "six" (seq 6), across the tool messages; none from the other session.
    assert await next_to("alice", (first, 6)) == ["two", "three", "seven", "eight"]
    assert await next_to("alice", (first, 6), per_side=1) == ["three", "seven"]
    # Near the start of a session, and overlapping positions, each turn once.
    assert await next_to("alice", (first, 1), (first, 2)) == ["one", "two", "three", "six"]
    assert sorted(await next_to("alice", (second, 1), (first, 8))) == [
        "other two",
        "seven",
        "six",
    ]
    # Another user's session is not found through a position, however it is named.
    assert await next_to("alice", (bobs, 1)) == []
    assert await next_to("alice") == []


async def test_whether_a_user_has_entries_in_another_session(database: Database) -> None:
    """Asked of the user's other sessions (each one lookup), the same in a session's state
    and on its own: an empty session does not count, nor another user's entries."""
    await make_user(database, "alice", "Alice")
    await make_user(database, "bob", "Bob")
    current = await make_session(database, "alice", *[("user", f"turn {n}") for n in range(30)])
    await make_session(database, "bob", ("user", "Bob's own words."))

    async def answers() -> tuple[bool | None, bool]:
        async with database.driver_reading() as scope:
            state = await read_state(scope, current)
            assert state is not None
            return state.others_indexed, await RecallIndexReads(scope).has_entries_outside(
                "alice", current
            )

    assert await answers() == (False, False)
    await make_session(database, "alice")  # a session with nothing indexed
    assert await answers() == (False, False)
    await make_session(database, "alice", ("user", "An earlier word."))
    assert await answers() == (True, True)


async def test_a_word_seen_once_in_the_window_of_a_long_history_is_looked_up_everywhere(
    database: Database,
) -> None:
    await make_user(database, "alice", "Alice")
    await add_history(database, "alice", ["Zeppelin tickets booked for Priya."], day=0)
    await add_history(database, "alice", [f"{COMMON} ({n})" for n in range(400)], day=1)
    await add_history(database, "alice", ["Where are the zeppelin tickets?"], day=2)
    # One sighting in a window of 40 of 402 entries stands for about ten, past the five rare
    # postings; the word is looked up all the same, and the old turn found.
    found, _ = await bounded(database, "zeppelin")
    assert found == ["Where are the zeppelin tickets?", "Zeppelin tickets booked for Priya."]


async def test_words_other_users_wrote_meanwhile_do_not_hide_a_users_rare_word(
    database: Database,
) -> None:
    for user_id, name in (("alice", "Alice"), ("bob", "Bob")):
        await make_user(database, user_id, name)
    await add_history(database, "alice", ["Zeppelin tickets booked for Priya."], day=0)
    await add_history(database, "alice", [f"{COMMON} ({n})" for n in range(30)], day=1)
    # While alice was away, bob talked about zeppelins all along: his turns lie between
    # alice's recent ones (a shared database), and none of them is hers.
    await add_history(
        database, "bob", [f"The zeppelin museum, part {n}." for n in range(300)], day=2
    )
    await add_history(database, "alice", [f"{COMMON} (again {n})" for n in range(20)], day=3)
    await add_history(database, "alice", ["Where are the zeppelin tickets?"], day=4)
    found, examined = await bounded(database, "zeppelin")
    assert found == ["Where are the zeppelin tickets?", "Zeppelin tickets booked for Priya."]
    assert examined <= SMALL.most_examined


async def test_an_old_passage_found_through_a_rare_word_counts_the_common_words_too(
    database: Database,
) -> None:
    await make_user(database, "alice", "Alice")
    museum, tickets = "Zeppelin museum visit.", "Zeppelin tickets ready for the budget review."
    await add_history(database, "alice", [museum, tickets], day=0)
    recent = [
        f"Budget review notes ({n})." if n % 4 == 0 else f"Lunch and travel ({n})."
        for n in range(100)
    ]
    await add_history(database, "alice", recent, day=1)
    found, _ = await bounded(database, "zeppelin", "budget", "review")
    # Both old turns are found through "zeppelin"; the one that also names the budget review
    # ranks first, though the shorter one weighs more on "zeppelin" alone.
    assert found[:2] == [tickets, museum]
