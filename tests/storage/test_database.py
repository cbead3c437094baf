"""The schema, migrations and repositories, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, func, make_url, select, text
from sqlalchemy.exc import IntegrityError

from errors import StorageError
from sessions.lifecycle import transition
from storage import driver_rows
from storage.database import Database, redact_url
from storage.driver_rows import pipelined
from storage.models import (
    Base,
    InboundEvent,
    InboundStatus,
    OutboundMessage,
    OutboundStatus,
    Session,
    SessionChannel,
    SessionMessage,
    SessionStatus,
    UserChannelIdentity,
)
from storage.repositories.inbox import (
    InboxRepository,
    NewInboundEvent,
    _next_pending,
    accept_events,
    send_user_queue,
)
from storage.repositories.outbox import OutboxRepository, mark_delivered
from storage.repositories.session_state import latest_active
from storage.repositories.sessions import SessionRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from storage.turn_store import send_turn
from tests.storage.turn_rows import web_turn

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


async def make_user(database: Database, user_id: str = "alice") -> None:
    async with database.session() as session:
        await OrganizationRepository(session).upsert("acme", "Acme", "Makes anvils.")
        await UserRepository(session).upsert(user_id, "acme", user_id.title())


async def make_session(database: Database, user_id: str = "alice") -> str:
    async with database.session() as session:
        row = await SessionRepository(session).create(user_id, "acme", at=T0)
        return row.id


async def add_in_own_transaction(database: Database, row: object) -> None:
    async with database.session() as session:
        session.add(row)


# The recall index's backend-specific full-text structures are not models (migration 0002):
# the FTS5 table and its shadow tables on SQLite; the tsvector column, its GIN index and the
# per-user statistics table on PostgreSQL.
RECALL_FULL_TEXT = {
    ("table", "recall_fts"),
    ("table", "recall_fts_config"),
    ("table", "recall_fts_data"),
    ("table", "recall_fts_docsize"),
    ("table", "recall_fts_idx"),
    ("table", "recall_stats"),
    ("column", "tsv"),
    ("index", "recall_entries_tsv"),
}


def _not_recall_full_text(obj: object, name: str | None, type_: str, *_: object) -> bool:
    if (type_, name) not in RECALL_FULL_TEXT:
        return True
    table = getattr(obj, "table", None)
    return type_ == "column" and getattr(table, "name", None) != "recall_entries"


async def test_migrations_create_exactly_the_models(database: Database) -> None:
    def diff(connection: Connection) -> list[object]:
        context = MigrationContext.configure(
            connection,
            opts={"compare_type": True, "include_object": _not_recall_full_text},
        )
        return list(compare_metadata(context, Base.metadata))

    async with database.engine.connect() as connection:
        assert await connection.run_sync(diff) == []
    assert await database.current_revision() == Database.head_revision()


async def test_upgrade_twice_is_a_no_op(database: Database) -> None:
    await database.upgrade()
    assert await database.current_revision() == Database.head_revision()


async def test_channel_identity_maps_to_exactly_one_user(database: Database) -> None:
    await make_user(database, "alice")
    await make_user(database, "bob")
    async with database.session() as session:
        users = UserRepository(session)
        await users.link_identity("alice", "slack", "T1:U1")
        await users.link_identity("alice", "slack", "T1:U1")  # idempotent
        with pytest.raises(StorageError, match="already belongs to user 'alice'"):
            await users.link_identity("bob", "slack", "T1:U1")
    async with database.session() as session:
        owner = await UserRepository(session).find_by_identity("slack", "T1:U1")
        assert owner is not None
        assert owner.id == "alice"
        count = await session.scalar(select(func.count()).select_from(UserChannelIdentity))
        assert count == 1


async def test_messages_get_gapless_sequence_numbers_and_counters(database: Database) -> None:
    await make_user(database)
    session_id = await make_session(database)
    async with database.session() as session:
        sessions = SessionRepository(session)
        loaded = await sessions.get(session_id)  # a row read before the appends …
        for index in range(3):
            await sessions.append_message(
                session_id,
                role="user" if index % 2 == 0 else "assistant",
                channel_type="web",
                content=f"message {index}",
                at=T0 + timedelta(minutes=index),
                metadata={"blocks": [{"type": "text", "text": "x"}]} if index == 1 else None,
            )
        assert loaded is not None  # … sees the counters the appends moved
        assert (loaded.message_count, loaded.last_seq) == (3, 3)
    messages, row = await stored_session(database, session_id)
    assert [message.seq for message in messages] == [1, 2, 3]
    assert [message.content for message in messages] == ["message 0", "message 1", "message 2"]
    assert messages[1].metadata_json == {"blocks": [{"type": "text", "text": "x"}]}
    assert row is not None
    assert (row.message_count, row.user_message_count, row.assistant_message_count) == (3, 2, 1)
    assert row.last_active_at == T0 + timedelta(minutes=2)
    assert row.last_active_at.tzinfo is not None


async def test_concurrent_appends_never_share_a_sequence_number(database: Database) -> None:
    await make_user(database)
    session_id = await make_session(database)

    async def append(index: int) -> None:
        async with database.session() as session:
            await SessionRepository(session).append_message(
                session_id, role="user", channel_type="web", content=str(index), at=T0
            )

    await asyncio.gather(*(append(index) for index in range(20)))
    async with database.session() as session:
        seqs = [message.seq for message in await SessionRepository(session).messages(session_id)]
    assert seqs == list(range(1, 21))


async def stored_session(
    database: Database, session_id: str
) -> tuple[list[SessionMessage], Session | None]:
    """The session's stored messages and its row, read in a session of their own."""
    async with database.session() as session:
        sessions = SessionRepository(session)
        return list(await sessions.messages(session_id)), await sessions.get(session_id)


async def send_after(
    database: Database, session_id: str, after_seq: int, text: str, answers: Sequence[str] = ("ok",)
) -> int:
    """A turn's rows (`text`, then `answers`) numbered after `after_seq` without waiting
    (`send_turn`), committed once its answers are in; the first number."""
    async with database.session() as session:
        event_id = await InboxRepository(session).accept(
            "web",
            f"{text}-{after_seq}",
            sender_key="web:alice",
            message={"content": text},
            raw_payload={},
            at=T0,
        )
    assert event_id is not None
    turn = web_turn(
        session_id,
        [text, *answers],
        after_seq=after_seq,
        event_id=event_id,
        reply_id=f"reply-{text}-{after_seq}",
        at=T0,
    )
    async with database.session() as session:
        async with pipelined(session):
            sent = await send_turn(session, turn, at=T0)
        assert await sent.event_was_pending()
        await sent.confirm()
        return sent.first_seq


async def test_a_turn_numbers_after_what_it_read_and_fails_whole_if_that_moved(
    database: Database,
) -> None:
    await make_user(database)
    session_id = await make_session(database)
    assert await send_after(database, session_id, 0, "first") == 1
    assert await send_after(database, session_id, 2, "second") == 3
    # Read before another writer appended (behind), or a number never reached (ahead): the
    # whole transaction fails, and nothing of it stays.
    for stale in (1, 7):
        with pytest.raises(StorageError):
            await send_after(database, session_id, stale, "stale")
    messages, row = await stored_session(database, session_id)
    assert [(m.seq, m.content) for m in messages] == [
        (1, "first"),
        (2, "ok"),
        (3, "second"),
        (4, "ok"),
    ]
    assert row is not None
    assert (row.last_seq, row.message_count, row.user_message_count) == (4, 4, 2)


async def test_a_turn_of_more_messages_than_a_question_and_its_answer_is_stored_whole(
    database: Database,
) -> None:
    # On PostgreSQL past two messages (tool calls and results) they go as one array a column.
    await make_user(database)
    session_id = await make_session(database)
    assert await send_after(database, session_id, 0, "plain") == 1
    assert await send_after(database, session_id, 2, "tools", ("call", "result", "answer")) == 3
    messages, row = await stored_session(database, session_id)
    assert [(m.seq, m.role, m.content) for m in messages] == [
        (1, "user", "plain"),
        (2, "assistant", "ok"),
        (3, "user", "tools"),
        (4, "assistant", "call"),
        (5, "assistant", "result"),
        (6, "assistant", "answer"),
    ]
    assert all(m.metadata_json == {} and m.created_at == T0 for m in messages)
    assert row is not None
    assert (row.last_seq, row.message_count, row.assistant_message_count) == (6, 6, 4)


async def test_duplicate_sequence_number_is_refused_by_the_database(database: Database) -> None:
    await make_user(database)
    session_id = await make_session(database)
    async with database.session() as session:
        session.add(
            SessionMessage(
                session_id=session_id, seq=1, role="user", channel_type="web", content="x"
            )
        )
    duplicate = SessionMessage(
        session_id=session_id, seq=1, role="user", channel_type="web", content="y"
    )
    with pytest.raises(StorageError) as refused:
        await add_in_own_transaction(database, duplicate)
    assert isinstance(refused.value.__cause__, IntegrityError)


async def test_a_thread_belongs_to_one_session_but_a_dm_to_many(database: Database) -> None:
    await make_user(database)
    first, second = await make_session(database), await make_session(database)
    async with database.session() as session:
        sessions = SessionRepository(session)
        await sessions.record_channel(first, "slack", "D1", "", at=T0)
        await sessions.record_channel(first, "slack", "D1", "", at=T0 + timedelta(minutes=1))
        await sessions.record_channel(second, "slack", "D1", "", at=T0)
        await sessions.record_channel(first, "slack", "C1", "1700000000.000100", at=T0)
    async with database.session() as session:
        sessions = SessionRepository(session)
        channels = await sessions.channels(first)
        found = await sessions.find_by_thread("slack", "C1", "1700000000.000100")
        assert await sessions.find_by_thread("slack", "D1", "") is None
    assert [(c.channel_id, c.thread_id, c.message_count) for c in channels] == [
        ("D1", "", 2),
        ("C1", "1700000000.000100", 1),
    ]
    assert channels[0].last_message_at == T0 + timedelta(minutes=1)
    assert found is not None
    assert found.id == first
    stolen_thread = SessionChannel(
        session_id=second, channel_type="slack", channel_id="C1", thread_id="1700000000.000100"
    )
    with pytest.raises(StorageError) as refused:
        await add_in_own_transaction(database, stolen_thread)
    assert isinstance(refused.value.__cause__, IntegrityError)


async def test_latest_active_session_ignores_archived_ones(database: Database) -> None:
    await make_user(database)
    old, new = await make_session(database), await make_session(database)
    async with database.session() as session:
        sessions = SessionRepository(session)
        await sessions.append_message(
            new, role="user", channel_type="web", content="hi", at=T0 + timedelta(hours=1)
        )
        assert (await latest_active(session, "alice")).id == new  # type: ignore[union-attr]
        newest = await sessions.get(new)
        assert newest is not None
        transition(newest, SessionStatus.ARCHIVED, at=T0 + timedelta(hours=2), reason="test")
        await session.flush()
        latest = await latest_active(session, "alice")
        archived = await sessions.get(new)
    assert latest is not None
    assert latest.id == old
    assert archived is not None
    assert archived.archived_at == T0 + timedelta(hours=2)


async def test_deleting_a_user_removes_everything_of_theirs(database: Database) -> None:
    await make_user(database, "alice")
    await make_user(database, "bob")
    alice_session = await make_session(database, "alice")
    bob_session = await make_session(database, "bob")
    async with database.session() as session:
        sessions, users = SessionRepository(session), UserRepository(session)
        await users.link_identity("alice", "email", "alice@acme.example")
        for session_id in (alice_session, bob_session):
            await sessions.append_message(
                session_id, role="user", channel_type="web", content="secret", at=T0
            )
            await sessions.record_channel(session_id, "web", session_id, "", at=T0)
        event_id = await InboxRepository(session).accept(
            "web",
            "m-alice",
            sender_key="web:alice",
            message={"content": "secret"},
            raw_payload={},
            at=T0,
        )
        assert event_id is not None
        inbound = await session.get(InboundEvent, event_id)
        assert inbound is not None
        inbound.user_id, inbound.session_id = "alice", alice_session
        await OutboxRepository(session).enqueue(
            message_id="out-1",
            channel_type="web",
            channel_id="alice",
            content="reply",
            at=T0,
            user_id="alice",
            session_id=alice_session,
        )
    async with database.session() as session:
        assert await UserRepository(session).delete("alice")
    async with database.session() as session:
        remaining: dict[str, int] = {}
        for table in Base.metadata.sorted_tables:
            remaining[table.name] = int(
                await session.scalar(select(func.count()).select_from(table)) or 0
            )
    assert remaining["sessions"] == 1
    assert remaining["session_messages"] == 1
    assert remaining["session_channels"] == 1
    assert remaining["user_channel_identities"] == 0
    assert remaining["inbound_events"] == 0
    assert remaining["outbound_messages"] == 0
    assert remaining["users"] == 1


async def test_inbox_accepts_messages_arriving_together_in_one_statement(
    database: Database,
) -> None:
    def event(message_id: str, sender: str) -> NewInboundEvent:
        message = {"content": f"text of {message_id}", "emoji": "\u2603"}
        return NewInboundEvent("web", message_id, sender, T0, message, {"raw": [1, None]})

    async with database.statement(writes=True) as scope:
        assert await accept_events(scope, []) == []
        ids = await accept_events(
            scope, [event("m1", "web:alice"), event("m2", "web:bob"), event("m1", "web:alice")]
        )
        again = await accept_events(scope, [event("m2", "web:bob"), event("m3", "web:bob")])
    first, second, repeated = ids
    assert first is not None
    assert second is not None
    assert repeated is None  # the same message twice in one batch: the first is stored
    assert again[0] is None
    assert again[1] is not None
    async with database.session() as session:
        queued = await InboxRepository(session).queued(first)
        stored = await session.get(InboundEvent, first)
    assert queued is not None
    assert queued.message == {"content": "text of m1", "emoji": "\u2603"}
    assert queued.live_reply is None
    assert stored is not None
    assert (stored.status, stored.attempts, stored.received_at) == ("pending", 0, T0)
    assert stored.raw_payload == {"raw": [1, None]}
    # A batch of a hundred: ids in the batch's order, the stored ones and the repeats left
    # out.
    batch = [event(f"b{n}", f"web:u{n % 7}") for n in range(100)]
    async with database.statement(writes=True) as scope:
        ids = await accept_events(scope, [batch[0], event("m3", "web:bob"), *batch, batch[5]])
    assert ids[1] is None  # stored before
    assert ids[-1] is None  # twice in this batch
    assert ids[2] is None  # b0, twice in this batch
    new = [ids[0], *ids[3:-1]]
    assert all(isinstance(found, int) for found in new)
    assert new == sorted(new)
    async with database.session() as session:
        stored = await session.get(InboundEvent, ids[50])
    assert stored is not None
    assert (stored.message_id, stored.sender_key) == ("b48", "web:u6")
    assert stored.message == {"content": "text of b48", "emoji": "\u2603"}


async def test_inbox_accepts_a_message_id_once(database: Database) -> None:
    async with database.session() as session:
        inbox = InboxRepository(session)

        async def accept(channel: str, message_id: str, sender: str) -> int | None:
            return await inbox.accept(
                channel, message_id, sender_key=sender, message={}, raw_payload={}, at=T0
            )

        first = await accept("web", "m1", "web:alice")
        again = await accept("web", "m1", "web:alice")
        other_channel = await accept("slack", "m1", "slack:T1:U1")
        later = await accept("web", "m2", "web:alice")
    assert first is not None
    assert other_channel is not None
    assert later is not None
    assert again is None
    async with database.session() as session:
        inbox = InboxRepository(session)
        assert await inbox.pending_senders() == ["web:alice", "slack:T1:U1"]
        assert await inbox.pending_ids_of_sender("web:alice") == [first, later]
        queue = await (
            await send_user_queue(session, ["web:alice", "slack:T1:U1"], limit=10)
        ).events()
        assert [event.id for event in queue] == [first, other_channel, later]
        assert await inbox.finish(first, InboundStatus.DONE, at=T0)
        assert not await inbox.finish(first, InboundStatus.REJECTED, at=T0)
        assert await inbox.record_failure(later, "boom") == 1
        queue = await (await send_user_queue(session, ["web:alice"])).events()
    assert [event.id for event in queue] == [later]


async def test_a_users_queue_is_read_from_their_own_events_whatever_the_backlog(
    database: Database,
) -> None:
    """Every turn reads its user's queue (their identities' sender keys: a Slack one and a
    web one here) with a prepared statement, which PostgreSQL may plan once for every user
    while the table's statistics are off (never analyzed here). That plan must reach the
    user's pending events by sender, not walk every sender's pending events in queue order
    and filter them: the read would cost what the whole backlog costs."""
    if database.is_sqlite:
        pytest.skip("PostgreSQL's generic plans")
    bulk = """
INSERT INTO inbound_events (channel_type, message_id, sender_key, status, attempts,
                            received_at, message, raw_payload)
SELECT 'slack', :status || n, 'slack:T1:U' || n, :status, 0, :at, '{}', '{}'
FROM generate_series(1, :count) AS n"""
    async with database.session() as session:
        for status, count in (("done", 3000), ("pending", 1300)):
            await session.execute(text(bulk), {"status": status, "count": count, "at": T0})
    sql = re.sub(r":key_(\d)", lambda key: f"${int(key[1]) + 1}", _next_pending(2))
    sql = sql.replace(":limit", "$3")
    async with database.session() as session:
        await session.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
        await session.execute(text(f"PREPARE user_queue(text, text, int) AS {sql}"))
        explain = "EXPLAIN (ANALYZE, COSTS OFF) EXECUTE user_queue('slack:T1:U1200', 'web:u', 1)"
        plan = "\n".join((await session.execute(text(explain))).scalars())
    assert "ix_inbound_events_pending_sender" in plan
    assert "ix_inbound_events_status_id" not in plan
    assert "Rows Removed by Filter" not in plan


async def test_outbox_retries_then_delivers_or_gives_up(database: Database) -> None:
    lease = timedelta(seconds=60)
    async with database.session() as session:
        outbox = OutboxRepository(session)
        first = await outbox.enqueue(
            message_id="out-1", channel_type="web", channel_id="alice", content="a", at=T0
        )
        second = await outbox.enqueue(
            message_id="out-2", channel_type="web", channel_id="alice", content="b", at=T0
        )
    async with database.session() as session:
        outbox = OutboxRepository(session)
        claimed = await outbox.claim_due(T0, lease=lease)
        assert [(c.reply.message_id, c.resumed) for c in claimed] == [
            ("out-1", False),
            ("out-2", False),
        ]
        assert await outbox.claim_due(T0, lease=lease) == []  # leased to this sender
        await outbox.mark_attempt_failed(first.id, error="429", retry_at=T0 + timedelta(seconds=5))
        await outbox.mark_attempt_failed(second.id, error="gone", retry_at=None)
        assert await outbox.claim_due(T0, lease=lease) == []
        retried = await outbox.claim_due(T0 + timedelta(seconds=5), lease=lease)
        assert [(c.reply.message_id, c.resumed) for c in retried] == [("out-1", False)]
        await mark_delivered(session, {first.id: "p-1"}, at=T0)
        assert await outbox.backlog() == 0
        feed = await outbox.feed("web", "alice")
        assert [row.message_id for row in feed] == ["out-1", "out-2"]
        assert [row.message_id for row in await outbox.feed("web", "alice", after_id=first.id)] == [
            "out-2"
        ]
    async with database.session() as session:
        delivered = await session.get(OutboundMessage, first.id)
        failed = await session.get(OutboundMessage, second.id)
    assert delivered is not None
    assert failed is not None
    assert (delivered.status, delivered.attempts, delivered.platform_message_id) == (
        OutboundStatus.DELIVERED,
        2,
        "p-1",
    )
    assert (failed.status, failed.attempts, failed.last_error) == (
        OutboundStatus.FAILED,
        1,
        "gone",
    )


async def test_an_expired_sending_lease_is_claimed_again(database: Database) -> None:
    lease = timedelta(seconds=60)
    async with database.session() as session:
        await OutboxRepository(session).enqueue(
            message_id="out-1", channel_type="web", channel_id="alice", content="a", at=T0
        )
    async with database.session() as session:
        assert len(await OutboxRepository(session).claim_due(T0, lease=lease)) == 1
    async with database.session() as session:
        outbox = OutboxRepository(session)
        assert await outbox.claim_due(T0 + timedelta(seconds=59), lease=lease) == []
        # Its sender's lease ran out: it may have reached the platform already.
        [again] = await outbox.claim_due(T0 + timedelta(seconds=60), lease=lease)
        assert again.resumed


async def test_naive_datetimes_are_refused(database: Database) -> None:
    await make_user(database)
    with pytest.raises(StorageError, match="naive datetime"):
        async with database.session() as session:
            await SessionRepository(session).create(
                "alice",
                "acme",
                at=datetime(2026, 1, 1),
            )


async def test_postgresql_sessions_run_in_utc_without_jit_keeping_the_urls_own_options(
    migrated_postgres_url: str,
) -> None:
    # The server's default zone is not UTC; the URL sets a server option of its own.
    url = make_url(migrated_postgres_url).set(
        query={"options": "-c statement_timeout=4321 -c TimeZone=Asia/Kolkata"}
    )
    settings = (
        "SELECT now(), current_setting('TimeZone'), current_setting('statement_timeout'), "
        "current_setting('jit')"
    )
    database = Database(url.render_as_string(hide_password=False))
    try:
        async with database.session() as session:
            now, zone, timeout, jit = (await session.execute(text(settings))).one()
        assert (zone, timeout, jit) == ("UTC", "4321ms", "off")
        assert now.tzinfo is UTC  # as the driver returns it: no conversion left to make
        async with database.statement(writes=False) as lent:
            [(lent_now, lent_zone, _, lent_jit)] = await driver_rows.rows(lent, settings, {})
        assert (lent_now.tzinfo, lent_zone, lent_jit) == (UTC, "UTC", "off")
    finally:
        await database.dispose()
    # The URL may turn JIT back on; the zone stays UTC.
    url = url.set(query={"options": "-c jit=on -c TimeZone=Asia/Kolkata"})
    database = Database(url.render_as_string(hide_password=False))
    try:
        async with database.session() as session:
            _, zone, _, jit = (await session.execute(text(settings))).one()
        assert (zone, jit) == ("UTC", "on")
    finally:
        await database.dispose()


async def test_unreachable_database_is_a_clear_storage_error() -> None:
    database = Database("postgresql+psycopg://postgres:hunter2@127.0.0.1:1/none")
    with pytest.raises(StorageError, match="unreachable") as caught:
        await database.ping()
    assert "hunter2" not in str(caught.value)
    with pytest.raises(StorageError, match="migrating database"):
        await database.upgrade()
    await database.dispose()


def test_unsupported_database_url_names_the_supported_ones() -> None:
    with pytest.raises(StorageError, match=r"postgresql\+psycopg://"):
        Database("mysql://root@localhost/x")
    with pytest.raises(StorageError, match="invalid database URL"):
        Database("not a url")


def test_passwords_are_hidden_in_displayed_urls(tmp_path: Path) -> None:
    assert "s3cret" not in redact_url("postgresql+psycopg://u:s3cret@h/db")
    assert Database(f"sqlite+aiosqlite:///{tmp_path}/x/y.db").display_url.endswith("y.db")
    assert (tmp_path / "x").is_dir()


async def test_a_pending_replys_file_moves_out_of_its_reply_context_on_upgrade(
    empty_database_url: str,
) -> None:
    """Revision 0004: a file written into the reply context before it is still sent."""
    database = Database(empty_database_url)
    try:
        await database.upgrade("0003")
        await make_user(database)
        export = {"filename": "s.json", "content_type": "application/json", "content": "{}"}
        async with database.engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO outbound_messages (message_id, user_id, channel_type, "
                    "channel_id, thread_id, kind, content, reply_context, status, attempts, "
                    "next_attempt_at, created_at) VALUES ('out-1', 'alice', 'slack', 'D1', '', "
                    "'reply', 'here', :context, 'pending', 0, :at, :at)"
                ),
                {"context": json.dumps({"channel": "D1", "attachment": export}), "at": T0},
            )
        await database.upgrade()
        async with database.session() as session:
            (row,) = (await session.scalars(select(OutboundMessage))).all()
        assert row.attachment == export
        assert row.reply_context == {"channel": "D1"}
    finally:
        await database.dispose()


async def test_a_reading_session_neither_waits_for_the_writer_nor_sees_its_uncommitted_rows(
    database: Database,
) -> None:
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
    async with database.session() as writer:
        await OrganizationRepository(writer).upsert("globex", "Globex")
        # SQLite: the writer holds the write lock; a reading session takes none, so it reads
        # at once (a session would wait for the lock up to the busy timeout, 5 s).
        async with asyncio.timeout(2), database.reading() as reader:
            names = (await reader.execute(text("SELECT id FROM organizations"))).scalars()
            assert sorted(names) == ["acme"]
