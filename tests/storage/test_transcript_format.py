"""The transcript's layout, without a store: object keys by session, segments named by
sequence number and read in number order, session references that cannot escape their
prefix, and one compact JSON object per line."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from errors import StorageError
from storage.transcripts import (
    SessionRef,
    TranscriptLine,
    compaction_key,
    encode_lines,
    join_transcript,
    legacy_transcript_key,
    pre_compact_archive_key,
    session_prefix,
    transcript_keys,
    transcript_segment_key,
    user_prefix,
)
from tests.storage.transcript_samples import REF, T0, line, segment


def test_keys_follow_the_fixed_layout() -> None:
    assert session_prefix(REF) == "sessions/acme/alice/s1/"
    assert user_prefix("acme", "alice") == "sessions/acme/alice/"
    assert legacy_transcript_key(REF) == "sessions/acme/alice/s1/transcript.jsonl"
    assert segment(REF, 1) == "sessions/acme/alice/s1/transcript/0000000001.jsonl"
    assert segment(REF, 10_000) == "sessions/acme/alice/s1/transcript/0000010000.jsonl"
    assert segment(REF, 9_999_999_999) == "sessions/acme/alice/s1/transcript/9999999999.jsonl"
    assert compaction_key(REF, 1) == "sessions/acme/alice/s1/compact_001.json"
    assert compaction_key(REF, 42) == "sessions/acme/alice/s1/compact_042.json"
    assert (
        pre_compact_archive_key(REF, 1)
        == "sessions/acme/alice/s1/archive/full_transcript_pre_compact_001.jsonl"
    )


@pytest.mark.parametrize("n", [0, -1])
def test_compaction_numbers_start_at_one(n: int) -> None:
    with pytest.raises(StorageError):
        compaction_key(REF, n)
    with pytest.raises(StorageError):
        pre_compact_archive_key(REF, n)


@pytest.mark.parametrize("bad", [0, -1, 10**10, True, 1.0, "1"])
def test_segments_are_named_by_sequence_numbers_of_at_most_ten_digits(bad: Any) -> None:
    with pytest.raises(StorageError, match="first_seq"):
        transcript_segment_key(REF, bad)


def test_the_transcript_is_the_legacy_object_then_the_segments_in_number_order() -> None:
    listed = [
        segment(REF, 10),
        compaction_key(REF, 1),
        pre_compact_archive_key(REF, 1),
        segment(REF, 9),
        "sessions/acme/alice/s1/transcript/.tmp-abc",
        "sessions/acme/alice/s1/transcript/notes.txt",
        segment(SessionRef("acme", "alice", "s10"), 1),
        legacy_transcript_key(REF),
        segment(REF, 100_000),
    ]

    assert transcript_keys(REF, listed) == [
        legacy_transcript_key(REF),
        segment(REF, 9),
        segment(REF, 10),
        segment(REF, 100_000),
    ]
    assert transcript_keys(REF, iter(listed[:1])) == [segment(REF, 10)]
    assert transcript_keys(REF, [compaction_key(REF, 1)]) == []


def test_joining_parts_keeps_a_torn_last_line_away_from_the_next_part() -> None:
    torn = encode_lines([line(1)]) + b'{"msg_id":"m2"'
    joined = join_transcript([torn, b"", encode_lines([line(3)])])
    assert joined.split(b"\n")[1:] == [b'{"msg_id":"m2"', line(3).to_json().encode(), b""]
    assert join_transcript([]) == b""


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b", "a b", "é", "x\n"])
@pytest.mark.parametrize("field", ["org_id", "user_id", "session_id"])
def test_session_ref_rejects_components_that_could_escape_the_prefix(field: str, bad: str) -> None:
    parts = {"org_id": "acme", "user_id": "alice", "session_id": "s1"} | {field: bad}
    with pytest.raises(StorageError, match=field):
        SessionRef(**parts)


def test_session_ref_accepts_ids_like_emails_and_uuids() -> None:
    SessionRef("acme-1", "alice+work@acme.example", "0b9c2f1e-3a4d.v2_x")


@pytest.mark.parametrize("bad", ["..", "a/b", ""])
def test_user_prefix_validates_its_components(bad: str) -> None:
    with pytest.raises(StorageError):
        user_prefix("acme", bad)


def test_transcript_line_is_one_compact_json_object_with_the_fixed_keys() -> None:
    original = TranscriptLine("m1", "user", "teams", "t9", 'he said "hi"\nthen\u2028left', T0, 12)
    text = original.to_json()
    assert "\n" not in text
    assert "\u2028" not in text
    assert ", " not in text
    record = json.loads(text)
    assert list(record) == [
        "msg_id",
        "role",
        "channel",
        "thread_id",
        "content",
        "timestamp",
        "tokens",
    ]
    assert record["timestamp"] == "2025-01-02T03:04:05.678000+00:00"
    assert TranscriptLine.from_json(text) == original


def test_transcript_line_timestamps_are_written_in_utc() -> None:
    cet = timezone(timedelta(hours=1))
    local = TranscriptLine("m1", "user", "web", None, "x", datetime(2025, 1, 1, 13, tzinfo=cet), 1)
    assert json.loads(local.to_json())["timestamp"] == "2025-01-01T12:00:00+00:00"


def test_transcript_line_refuses_a_naive_timestamp() -> None:
    with pytest.raises(StorageError, match="naive"):
        TranscriptLine("m1", "user", "web", None, "x", datetime(2025, 1, 1), 1)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"msg_id": "m1"}',
        line(1).to_json()[:-1] + ',"extra":1}',
        line(1).to_json().replace('"tokens":1', '"tokens":"1"'),
    ],
)
def test_a_malformed_transcript_line_raises_storage_error(text: str) -> None:
    with pytest.raises(StorageError):
        TranscriptLine.from_json(text)
