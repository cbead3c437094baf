"""The session lifecycle: the allowed transitions, and nothing else."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from errors import SessionStateError
from sessions.lifecycle import check_transition, transition
from storage.models import Session, SessionStatus

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
