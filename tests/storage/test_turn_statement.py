"""The turn's statement on PostgreSQL (`storage.turn_store.send_turn`): one text whatever the
number of messages, within what psycopg caches, its parts sharing the values they have in
common."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from psycopg import _queries

from errors import StorageError
from storage.turn_store import TurnRows, _counters, _finish, _turn_write
from tests.storage.turn_rows import web_turn

AT = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)


def rows(messages: int, *, reply_session: str = "s1") -> TurnRows:
    texts = [f"message {n}" for n in range(messages)]
    return web_turn(
        "s1", texts, after_seq=10, event_id=7, reply_id="r1", at=AT, reply_session=reply_session
    )


def write(turn: TurnRows) -> tuple[str, dict[str, object]]:
    counters = {**_counters(turn.session_id, turn.messages, AT, None), "after_seq": 10}
    finish = _finish(7, turn.status, AT, user_id="alice", session_id="s1", seq=11, error=None)
    return _turn_write(turn, {**counters, **finish}, turn.channel.params(turn.session_id, AT))


def params(turn: TurnRows) -> dict[str, object]:
    return write(turn)[1]


@pytest.mark.parametrize("messages", [1, 2, 3, 12])
def test_the_turn_statement_stays_within_psycopgs_statement_cache(messages: int) -> None:
    # A statement past either limit is parsed again at every call (0.1-0.3 ms of a turn).
    statement, sent = write(rows(messages))
    assert len(statement.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH
    assert len(sent) <= _queries.MAX_CACHED_STATEMENT_PARAMS
    contents = [f"message {n}" for n in range(messages)]
    if messages <= 2:
        assert [sent[f"content_{n}"] for n in range(messages)] == contents
    else:
        assert sent["m_content"] == contents
        assert statement == write(rows(3))[0]  # one text for any number past two


def test_a_reply_of_another_session_than_the_turns_is_refused() -> None:
    with pytest.raises(StorageError, match="another session_id"):
        params(rows(2, reply_session="s2"))
