"""The transcript store: the same behaviour on a local folder and on S3 (moto over HTTP).

What only one store can get wrong is in test_local_transcripts.py, test_s3_transcripts.py and
test_s3_transcript_costs.py; the keys and the line format in test_transcript_format.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from errors import ArchiveExistsError, StorageError
from storage.local_transcripts import LocalTranscriptStore
from storage.s3_transcripts import S3TranscriptStore
from storage.transcripts import (
    SessionRef,
    StoredObject,
    TranscriptStore,
    compaction_key,
    encode_lines,
    legacy_transcript_key,
    parse_transcript,
    pre_compact_archive_key,
)
from tests.storage.transcript_samples import REF, line, segment, turn


@pytest.fixture(params=["local", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TranscriptStore]:
    """The same behaviour tests run on both backends; S3 uses a prefix to exercise it."""
    if request.param == "local":
        yield LocalTranscriptStore(tmp_path / "transcripts")
        return
    # Looked up lazily so the local variant does not start the S3 server.
    s3 = S3TranscriptStore(
        request.getfixturevalue("bucket"),
        prefix="gateway/",
        endpoint_url=request.getfixturevalue("s3_endpoint"),
        boto_session=request.getfixturevalue("boto_session"),
    )
    yield s3
    await s3.close()


async def test_appended_lines_read_back_in_order(store: TranscriptStore) -> None:
    await store.append_lines(REF, [line(1), line(2)], first_seq=1)
    await store.append_lines(REF, [line(3)], first_seq=3)
    await store.append_lines(REF, [], first_seq=4)
    await store.append_lines(REF, [line(4), line(5, "ünïcødé \u2028 and\nnewline")], first_seq=4)

    data = await store.read_transcript(REF)

    assert parse_transcript(data) == [
        line(1),
        line(2),
        line(3),
        line(4),
        line(5, "ünïcødé \u2028 and\nnewline"),
    ]
    assert data.count(b"\n") == 5
    assert data.endswith(b"\n")


async def test_each_append_is_one_segment_named_by_its_first_sequence_number(
    store: TranscriptStore,
) -> None:
    await store.append_lines(REF, turn(1), first_seq=1)
    await store.append_lines(REF, turn(3), first_seq=3)
    await store.append_lines(REF, [], first_seq=5)  # nothing to write: no segment

    assert await store.list_session(REF) == [segment(REF, 1), segment(REF, 3)]
    assert await store.read(segment(REF, 3)) == encode_lines(turn(3))


async def test_segments_are_read_in_number_order_not_in_writing_order(
    store: TranscriptStore,
) -> None:
    for first_seq in [11, 1, 9, 101, 3]:
        await store.append_lines(REF, [line(first_seq)], first_seq=first_seq)

    lines = parse_transcript(await store.read_transcript(REF))

    assert [x.tokens for x in lines] == [1, 3, 9, 11, 101]


async def test_a_legacy_transcript_is_read_before_the_segments(store: TranscriptStore) -> None:
    # What earlier versions left: one `transcript.jsonl` grown in place.
    await store.write_archive(legacy_transcript_key(REF), encode_lines([line(1), line(2)]))
    await store.append_lines(REF, [line(3), line(4)], first_seq=3)
    await store.append_lines(REF, [line(5)], first_seq=5)

    data = await store.read_transcript(REF)

    assert parse_transcript(data) == [line(i) for i in range(1, 6)]
    assert await store.list_session(REF) == [
        legacy_transcript_key(REF),
        segment(REF, 3),
        segment(REF, 5),
    ]


async def test_a_session_without_a_transcript_reads_as_empty(store: TranscriptStore) -> None:
    await store.write_archive(pre_compact_archive_key(REF, 1), encode_lines([line(1)]))
    await store.append_lines(SessionRef("acme", "alice", "s10"), [line(1)], first_seq=1)

    assert await store.read_transcript(REF) == b""
    assert await store.read_transcript(SessionRef("acme", "nobody", "s1")) == b""


async def test_appending_the_same_batch_again_leaves_one_copy(store: TranscriptStore) -> None:
    # A retried turn appends its batch again, under the same first sequence number.
    await store.append_lines(REF, turn(1), first_seq=1)
    await store.append_lines(REF, turn(3), first_seq=3)
    await store.append_lines(REF, turn(3), first_seq=3)

    assert parse_transcript(await store.read_transcript(REF)) == turn(1) + turn(3)
    assert await store.list_session(REF) == [segment(REF, 1), segment(REF, 3)]


@pytest.mark.parametrize("bad", [0, -5, 10**10, True])
async def test_an_append_without_a_valid_sequence_number_writes_nothing(
    store: TranscriptStore, bad: int
) -> None:
    with pytest.raises(StorageError, match="first_seq"):
        await store.append_lines(REF, [line(1)], first_seq=bad)
    with pytest.raises(StorageError, match="first_seq"):
        await store.append_lines(REF, [], first_seq=bad)
    assert await store.list_session(REF) == []


async def test_objects_are_stored_under_the_layout_keys(store: TranscriptStore) -> None:
    await store.append_lines(REF, [line(1)], first_seq=1)
    await store.write_archive(compaction_key(REF, 1), b"{}")
    await store.write_archive(pre_compact_archive_key(REF, 1), b"x\n")

    assert await store.list_session(REF) == [
        "sessions/acme/alice/s1/archive/full_transcript_pre_compact_001.jsonl",
        "sessions/acme/alice/s1/compact_001.json",
        "sessions/acme/alice/s1/transcript/0000000001.jsonl",
    ]


async def test_an_archive_is_never_overwritten(store: TranscriptStore) -> None:
    key = pre_compact_archive_key(REF, 1)
    stored = await store.write_archive(key, b"first")

    with pytest.raises(ArchiveExistsError) as raised:
        await store.write_archive(key, b"second, longer")

    assert stored == StoredObject(key=key, size=5)
    assert raised.value.key == key
    assert await store.read(key) == b"first"


async def test_reading_a_missing_key_names_the_key(store: TranscriptStore) -> None:
    key = compaction_key(REF, 7)
    with pytest.raises(StorageError, match=r"compact_007\.json") as raised:
        await store.read(key)
    assert raised.value.key == key
    assert "does not exist" in str(raised.value)


async def test_stat_reports_the_size_or_none(store: TranscriptStore) -> None:
    key = compaction_key(REF, 1)
    assert await store.stat(key) is None
    await store.write_archive(key, b"12345")
    assert await store.stat(key) == StoredObject(key=key, size=5)


async def test_list_session_returns_only_that_sessions_keys(store: TranscriptStore) -> None:
    neighbour = SessionRef("acme", "alice", "s10")  # shares the string prefix "s1"
    await store.append_lines(REF, [line(1)], first_seq=1)
    await store.append_lines(neighbour, [line(1)], first_seq=1)
    await store.append_lines(SessionRef("acme", "bob", "s1"), [line(1)], first_seq=1)

    assert await store.list_session(REF) == [segment(REF, 1)]
    assert parse_transcript(await store.read_transcript(REF)) == [line(1)]
    assert await store.list_session(SessionRef("acme", "alice", "none")) == []


async def test_delete_session_removes_only_that_session(store: TranscriptStore) -> None:
    other = SessionRef("acme", "alice", "s10")
    await store.write_archive(legacy_transcript_key(REF), encode_lines([line(1)]))
    for first_seq in range(2, 12, 2):
        await store.append_lines(REF, turn(first_seq), first_seq=first_seq)
    await store.write_archive(compaction_key(REF, 1), b"{}")
    await store.write_archive(pre_compact_archive_key(REF, 1), b"x")
    await store.append_lines(other, [line(1)], first_seq=1)

    assert await store.delete_session(REF) == 1 + 5 + 2

    assert await store.list_session(REF) == []
    assert await store.read_transcript(REF) == b""
    assert await store.list_session(other) == [segment(other, 1)]
    assert await store.delete_session(REF) == 0


async def test_delete_user_removes_all_their_sessions_and_nothing_else(
    store: TranscriptStore,
) -> None:
    alice = [SessionRef("acme", "alice", f"s{i}") for i in range(3)]
    bob = SessionRef("acme", "bob", "s1")
    alice_elsewhere = SessionRef("other-org", "alice", "s1")
    for ref in [*alice, bob, alice_elsewhere]:
        await store.append_lines(ref, turn(1), first_seq=1)
        await store.append_lines(ref, turn(3), first_seq=3)
    await store.write_archive(legacy_transcript_key(alice[1]), encode_lines([line(1)]))
    await store.write_archive(compaction_key(alice[0], 1), b"{}")

    assert await store.delete_user("acme", "alice") == 3 * 2 + 2

    for ref in alice:
        assert await store.list_session(ref) == []
        assert await store.read_transcript(ref) == b""
    assert await store.list_session(bob) == [segment(bob, 1), segment(bob, 3)]
    assert await store.list_session(alice_elsewhere) == [
        segment(alice_elsewhere, 1),
        segment(alice_elsewhere, 3),
    ]


async def test_appending_after_a_deletion_starts_a_new_transcript(store: TranscriptStore) -> None:
    await store.append_lines(REF, turn(1), first_seq=1)
    await store.delete_session(REF)

    await store.append_lines(REF, [line(3)], first_seq=3)

    assert parse_transcript(await store.read_transcript(REF)) == [line(3)]


async def test_concurrent_appends_lose_no_line_and_read_back_in_order(
    store: TranscriptStore,
) -> None:
    await asyncio.gather(*(store.append_lines(REF, [line(i)], first_seq=i) for i in range(1, 21)))

    lines = parse_transcript(await store.read_transcript(REF))

    assert lines == [line(i) for i in range(1, 21)]


async def test_check_passes_on_a_usable_store(store: TranscriptStore) -> None:
    await store.check()


@pytest.mark.parametrize("key", ["../outside", "/etc/passwd", "sessions//x", "a/./b", ""])
async def test_keys_with_traversal_segments_are_refused(store: TranscriptStore, key: str) -> None:
    with pytest.raises(StorageError):
        await store.read(key)
    with pytest.raises(StorageError):
        await store.write_archive(key, b"x")
