"""The session lifecycle: the allowed transitions, and nothing else; every deletion is one of
them, logged with who asked, before the transcript store's objects and the rows go."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from sqlalchemy import func, select
from structlog.testing import capture_logs

import sessions.lifecycle
from errors import SessionStateError, StorageError
from sessions.lifecycle import DeletionReason, check_transition, delete_session, transition
from storage.database import Database
from storage.local_transcripts import LocalTranscriptStore
from storage.models import Session, SessionMessage, SessionStatus
from storage.repositories.sessions import SessionRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from storage.transcripts import SessionRef, TranscriptLine, pre_compact_archive_key
from storage.turn_store import MessageToStore, store_turn_messages

ACTIVE, COMPACTING = SessionStatus.ACTIVE, SessionStatus.COMPACTING
ARCHIVED, EXPORTED, DELETED = SessionStatus.ARCHIVED, SessionStatus.EXPORTED, SessionStatus.DELETED

# Written out from the lifecycle drawn in ARCHITECTURE.md and sessions/lifecycle.py, on purpose
# not imported: the table in the code is what is under test.
EXPECTED_ALLOWED = {
    (ACTIVE, COMPACTING),
    (COMPACTING, ACTIVE),
    (ACTIVE, ARCHIVED),
    (ARCHIVED, ACTIVE),
    (ACTIVE, EXPORTED),
    (ARCHIVED, EXPORTED),
    (EXPORTED, ACTIVE),
    (EXPORTED, ARCHIVED),
    (EXPORTED, DELETED),
    (ACTIVE, DELETED),
    (ARCHIVED, DELETED),
}
ALL_PAIRS = list(itertools.product(SessionStatus, repeat=2))
FORBIDDEN = [pair for pair in ALL_PAIRS if pair not in EXPECTED_ALLOWED]

AT = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


def session_in(status: SessionStatus) -> Session:
    return Session(id="s" * 32, user_id="alice", org_id="acme", status=status.value)


def pair_id(pair: tuple[SessionStatus, SessionStatus]) -> str:
    return f"{pair[0]}->{pair[1]}"


@pytest.mark.parametrize("pair", sorted(EXPECTED_ALLOWED), ids=pair_id)
def test_an_allowed_transition_changes_the_status(
    pair: tuple[SessionStatus, SessionStatus],
) -> None:
    current, target = pair
    check_transition(current, target)
    session = session_in(current)
    transition(session, target, at=AT, reason="test")
    assert session.status == target.value
    assert session.updated_at == AT


@pytest.mark.parametrize("pair", FORBIDDEN, ids=pair_id)
def test_every_other_transition_raises_and_leaves_the_session_alone(
    pair: tuple[SessionStatus, SessionStatus],
) -> None:
    current, target = pair
    with pytest.raises(SessionStateError, match=f"from {current} to {target}"):
        check_transition(current, target)
    session = session_in(current)
    with pytest.raises(SessionStateError):
        transition(session, target, at=AT, reason="test")
    assert session.status == current.value
    assert session.archived_at is None


def test_every_pair_of_states_is_covered() -> None:
    assert len(ALL_PAIRS) == len(SessionStatus) ** 2 == 25
    assert len(FORBIDDEN) == 25 - len(EXPECTED_ALLOWED)


def test_a_deleted_session_can_go_nowhere() -> None:
    for target in SessionStatus:
        with pytest.raises(SessionStateError):
            check_transition(DELETED, target)


@pytest.mark.parametrize("current", [ACTIVE, EXPORTED], ids=str)
def test_archiving_sets_archived_at(current: SessionStatus) -> None:
    session = session_in(current)
    transition(session, ARCHIVED, at=AT, reason="idle")
    assert session.status == "archived"
    assert session.archived_at == AT
    assert session.updated_at == AT


@pytest.mark.parametrize(
    ("current", "target"),
    [(ACTIVE, COMPACTING), (ACTIVE, EXPORTED), (ACTIVE, DELETED), (ARCHIVED, ACTIVE)],
    ids=str,
)
def test_other_transitions_do_not_set_archived_at(
    current: SessionStatus, target: SessionStatus
) -> None:
    session = session_in(current)
    transition(session, target, at=AT, reason="test")
    assert session.archived_at is None


# --- deletion: the one way a session goes ------------------------------------------------------


class FailingDeletes(LocalTranscriptStore):
    """A real local store whose deletions fail, as an unreachable S3 would."""

    async def delete_session(self, ref: SessionRef) -> int:
        raise StorageError("the transcript store is unreachable")


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The lifecycle's log lines during the test."""
    with capture_logs() as entries:
        # A fresh logger: the module's own may have been cached by an earlier logging set-up.
        monkeypatch.setattr(sessions.lifecycle, "log", structlog.get_logger("sessions.lifecycle"))
        yield entries


async def stored_session(database: Database, store: LocalTranscriptStore) -> SessionRef:
    """Alice's session with a message in the database and a segment and an archive stored."""
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("alice", "acme", "Alice")
        session = await SessionRepository(db).create("alice", "acme", at=AT)
        await store_turn_messages(db, session.id, [MessageToStore("user", "web", "hi", 1)], at=AT)
    ref = SessionRef("acme", "alice", session.id)
    line = TranscriptLine("m1", "user", "web", None, "hi", AT, 1)
    await store.append_lines(ref, [line], first_seq=1)
    await store.write_archive(pre_compact_archive_key(ref, 1), line.to_json().encode())
    return ref


async def rows_of(database: Database, session_id: str) -> tuple[str | None, int]:
    """The session's status (None: no row) and how many messages it holds."""
    async with database.session() as db:
        status = await db.scalar(select(Session.status).where(Session.id == session_id))
        messages = await db.scalar(
            select(func.count())
            .select_from(SessionMessage)
            .where(SessionMessage.session_id == session_id)
        )
    return status, int(messages or 0)


async def delete(
    database: Database, store: LocalTranscriptStore, ref: SessionRef, **kw: Any
) -> int:
    async with database.session() as db:
        session = await SessionRepository(db).get(ref.session_id, for_update=True)
        assert session is not None
        return await delete_session(db, session, transcripts=store, at=AT, **kw)


@pytest.mark.parametrize("reason", ["user", "admin", "retention"])
async def test_a_deletion_is_a_logged_transition_naming_who_asked_and_leaves_nothing(
    database: Database, tmp_path: Path, logged: list[dict[str, Any]], reason: DeletionReason
) -> None:
    store = LocalTranscriptStore(tmp_path / "transcripts")
    ref = await stored_session(database, store)

    objects = await delete(database, store, ref, reason=reason)

    assert objects == 2
    assert await store.list_session(ref) == []
    assert await rows_of(database, ref.session_id) == (None, 0)
    (line,) = [entry for entry in logged if entry["event"] == "session.transitioned"]
    assert line == {
        "event": "session.transitioned",
        "log_level": "info",
        "session_id": ref.session_id,
        "user_id": "alice",
        "from_status": "active",
        "to_status": "deleted",
        "reason": reason,
    }


async def test_a_failing_transcript_store_leaves_the_whole_session_to_delete_again(
    database: Database, tmp_path: Path
) -> None:
    failing = FailingDeletes(tmp_path / "transcripts")
    ref = await stored_session(database, failing)

    with pytest.raises(StorageError):
        await delete(database, failing, ref, reason="admin")

    assert await rows_of(database, ref.session_id) == ("active", 1)
    working = LocalTranscriptStore(tmp_path / "transcripts")
    assert await delete(database, working, ref, reason="admin") == 2
    assert await rows_of(database, ref.session_id) == (None, 0)


async def test_a_session_in_the_middle_of_a_compaction_is_not_deleted(
    database: Database, tmp_path: Path, logged: list[dict[str, Any]]
) -> None:
    store = LocalTranscriptStore(tmp_path / "transcripts")
    ref = await stored_session(database, store)
    async with database.session() as db:
        session = await SessionRepository(db).get(ref.session_id)
        assert session is not None
        session.status = COMPACTING.value

    with pytest.raises(SessionStateError, match="from compacting to deleted"):
        await delete(database, store, ref, reason="retention")

    assert len(await store.list_session(ref)) == 2
    assert await rows_of(database, ref.session_id) == ("compacting", 1)
    assert not [entry for entry in logged if entry["event"] == "session.transitioned"]
