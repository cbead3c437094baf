"""The transcript store: the same behaviour on a local folder and on S3 (moto over HTTP)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from errors import ArchiveExistsError, StorageError
from storage.local_transcripts import LocalTranscriptStore
from storage.s3_transcripts import S3TranscriptStore
from storage.transcripts import (
    SessionRef,
    StoredObject,
    TranscriptLine,
    TranscriptStore,
    compaction_key,
    encode_lines,
    join_transcript,
    legacy_transcript_key,
    parse_transcript,
    pre_compact_archive_key,
    session_prefix,
    transcript_keys,
    transcript_segment_key,
    user_prefix,
)

REF = SessionRef("acme", "alice", "s1")
T0 = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def line(n: int, content: str | None = None) -> TranscriptLine:
    return TranscriptLine(
        msg_id=f"m{n}",
        role="user" if n % 2 else "assistant",
        channel="slack",
        thread_id=None if n % 3 else f"t{n}",
        content=content if content is not None else f"message {n}",
        timestamp=T0 + timedelta(seconds=n),
        tokens=n,
    )


def turn(first_seq: int) -> list[TranscriptLine]:
    """A turn as the gateway appends it: the user's message and the answer, the same size
    whatever their sequence numbers, so two turns' bytes can be compared."""
    return [
        TranscriptLine(
            msg_id=f"m{seq:010d}",
            role=role,
            channel="web",
            thread_id=None,
            content="x" * 200,
            timestamp=T0,
            tokens=50,
        )
        for seq, role in [(first_seq, "user"), (first_seq + 1, "assistant")]
    ]


def segment(ref: SessionRef, first_seq: int) -> str:
    return transcript_segment_key(ref, first_seq)


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
    s3.close()


@pytest.fixture
def s3_store(s3_endpoint: str, boto_session: Any, bucket: str) -> Iterator[S3TranscriptStore]:
    store = S3TranscriptStore(bucket, endpoint_url=s3_endpoint, boto_session=boto_session)
    yield store
    store.close()


# --- values and keys -------------------------------------------------------------------------


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


# --- behaviour of every store ----------------------------------------------------------------


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


# --- local folder only -----------------------------------------------------------------------


async def test_local_key_escaping_root_through_a_symlink_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (root / "sessions").mkdir(parents=True)
    (root / "sessions" / "acme").symlink_to(outside)
    store = LocalTranscriptStore(root)

    with pytest.raises(StorageError, match="outside"):
        await store.read("sessions/acme/secret")
    with pytest.raises(StorageError, match="outside"):
        await store.write_archive("sessions/acme/new", b"x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


async def test_local_writes_leave_no_temp_files(tmp_path: Path) -> None:
    store = LocalTranscriptStore(tmp_path)
    key = compaction_key(REF, 1)
    await store.write_archive(key, b"one")
    with pytest.raises(ArchiveExistsError):
        await store.write_archive(key, b"two")
    await store.append_lines(REF, turn(1), first_seq=1)
    await store.append_lines(REF, turn(1), first_seq=1)

    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files == [key, segment(REF, 1)]


async def test_local_a_temp_file_left_by_a_crash_is_not_part_of_the_transcript(
    tmp_path: Path,
) -> None:
    store = LocalTranscriptStore(tmp_path)
    await store.append_lines(REF, turn(1), first_seq=1)
    leftover = tmp_path / segment(REF, 1)
    leftover.with_name(".tmp-crashed").write_bytes(b'{"torn')

    assert parse_transcript(await store.read_transcript(REF)) == turn(1)
    assert await store.list_session(REF) == [segment(REF, 1)]
    assert await store.delete_session(REF) == 2  # the leftover goes too
    assert list(tmp_path.iterdir()) == []


def files_of(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under `root`: its size, inode and modification time."""
    return {
        p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_ino, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


async def test_local_the_10000th_append_writes_what_the_10th_did(tmp_path: Path) -> None:
    store = LocalTranscriptStore(tmp_path)
    short, long = SessionRef("acme", "alice", "short"), SessionRef("acme", "alice", "long")
    for first_seq in range(1, 9, 2):
        await store.append_lines(short, turn(first_seq), first_seq=first_seq)
    # 9,998 messages: most in a legacy file (quick to make), the last turns as segments.
    legacy = [line for first_seq in range(1, 9_991, 2) for line in turn(first_seq)]
    await store.write_archive(legacy_transcript_key(long), encode_lines(legacy))
    for first_seq in range(9_991, 9_999, 2):
        await store.append_lines(long, turn(first_seq), first_seq=first_seq)

    written = {}
    for ref, first_seq in [(short, 9), (long, 9_999)]:
        before = files_of(tmp_path)
        await store.append_lines(ref, turn(first_seq), first_seq=first_seq)
        after = files_of(tmp_path)
        # One new file of the turn's bytes; nothing that was there is rewritten or replaced.
        assert {k: v for k, v in after.items() if k in before} == before
        assert list(after.keys() - before.keys()) == [segment(ref, first_seq)]
        written[first_seq] = after[segment(ref, first_seq)][0]

    assert written[9] == written[9_999] == len(encode_lines(turn(1)))
    lines = parse_transcript(await store.read_transcript(long))
    assert len(lines) == 10_000
    assert lines[-2:] == turn(9_999)


async def test_local_delete_removes_the_folders_it_empties(tmp_path: Path) -> None:
    store = LocalTranscriptStore(tmp_path)
    await store.write_archive(pre_compact_archive_key(REF, 1), b"x")
    await store.append_lines(REF, turn(1), first_seq=1)
    await store.append_lines(SessionRef("acme", "bob", "s1"), [line(1)], first_seq=1)

    await store.delete_session(REF)
    assert not (tmp_path / "sessions/acme/alice").exists()
    assert (tmp_path / "sessions/acme/bob/s1").is_dir()

    await store.delete_user("acme", "bob")
    assert list(tmp_path.iterdir()) == []


async def test_local_appends_from_two_stores_on_one_folder_lose_no_line(tmp_path: Path) -> None:
    first, second = LocalTranscriptStore(tmp_path), LocalTranscriptStore(tmp_path)
    await asyncio.gather(
        *(
            (first if i % 2 else second).append_lines(REF, [line(i)], first_seq=i)
            for i in range(1, 21)
        )
    )
    assert parse_transcript(await second.read_transcript(REF)) == [line(i) for i in range(1, 21)]


async def test_local_check_fails_clearly_when_the_folder_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StorageError, match="not writable"):
        await LocalTranscriptStore(blocker / "transcripts").check()


# --- S3 only ---------------------------------------------------------------------------------


async def test_s3_check_names_a_missing_bucket(s3_endpoint: str, boto_session: Any) -> None:
    store = S3TranscriptStore(
        "no-such-bucket-here", endpoint_url=s3_endpoint, boto_session=boto_session
    )
    with pytest.raises(StorageError, match="S3 bucket 'no-such-bucket-here' does not exist"):
        await store.check()
    store.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_s3_check_fails_fast_when_the_endpoint_is_unreachable(boto_session: Any) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    store = S3TranscriptStore(
        "b", endpoint_url=endpoint, connect_timeout=0.5, max_attempts=1, boto_session=boto_session
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(StorageError, match=f"cannot reach S3 endpoint {endpoint}"):
        await store.check()
    assert loop.time() - started < 3
    store.close()


async def test_s3_errors_carry_the_key_and_the_cause(s3_endpoint: str, boto_session: Any) -> None:
    store = S3TranscriptStore(
        "no-such-bucket-here", endpoint_url=s3_endpoint, boto_session=boto_session
    )
    key = compaction_key(REF, 1)
    with pytest.raises(StorageError, match="S3 put_object failed: NoSuchBucket") as raised:
        await store.write_archive(key, b"x")
    assert raised.value.key == key
    with pytest.raises(StorageError, match="NoSuchBucket") as raised:
        await store.append_lines(REF, [line(1)], first_seq=1)
    assert raised.value.key == segment(REF, 1)
    with pytest.raises(StorageError, match="NoSuchBucket"):
        await store.read_transcript(REF)  # a missing bucket is not an empty transcript
    store.close()


async def test_s3_objects_are_encrypted_with_the_configured_kms_key(
    s3_endpoint: str, boto_session: Any, bucket: str, s3_client: Any, kms_client: Any
) -> None:
    key_id = kms_client.create_key(Description="transcripts")["KeyMetadata"]["KeyId"]
    store = S3TranscriptStore(
        bucket,
        endpoint_url=s3_endpoint,
        boto_session=boto_session,
        sse="aws:kms",
        kms_key_id=key_id,
    )
    await store.append_lines(REF, [line(1)], first_seq=1)
    await store.write_archive(compaction_key(REF, 1), b"{}")
    store.close()

    for key in [segment(REF, 1), compaction_key(REF, 1)]:
        head = s3_client.head_object(Bucket=bucket, Key=key)
        assert head["ServerSideEncryption"] == "aws:kms"
        assert head["SSEKMSKeyId"].endswith(key_id)


def test_s3_refuses_a_kms_key_without_kms_encryption() -> None:
    with pytest.raises(StorageError, match="kms_key_id"):
        S3TranscriptStore("b", sse="AES256", kms_key_id="k")
    with pytest.raises(StorageError, match="encryption"):
        S3TranscriptStore("b", sse="rot13")


@pytest.mark.parametrize(
    ("prefix", "expected"), [("", ""), ("tenant-a", "tenant-a/"), ("/tenant-a/x/", "tenant-a/x/")]
)
async def test_s3_prefix_is_applied_to_the_real_object_keys(
    s3_endpoint: str, boto_session: Any, bucket: str, s3_client: Any, prefix: str, expected: str
) -> None:
    store = S3TranscriptStore(
        bucket, prefix=prefix, endpoint_url=s3_endpoint, boto_session=boto_session
    )
    await store.append_lines(REF, [line(1)], first_seq=1)
    await store.write_archive(compaction_key(REF, 1), b"{}")
    s3_client.put_object(
        Bucket=bucket, Key=expected + legacy_transcript_key(REF), Body=line(0).to_json() + "\n"
    )

    listed = s3_client.list_objects_v2(Bucket=bucket)
    assert sorted(obj["Key"] for obj in listed["Contents"]) == [
        expected + compaction_key(REF, 1),
        expected + legacy_transcript_key(REF),
        expected + segment(REF, 1),
    ]
    assert await store.list_session(REF) == [
        compaction_key(REF, 1),
        legacy_transcript_key(REF),
        segment(REF, 1),
    ]
    assert parse_transcript(await store.read_transcript(REF)) == [line(0), line(1)]
    assert await store.delete_user("acme", "alice") == 3
    assert s3_client.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    store.close()


async def test_s3_delete_handles_more_than_one_batch(
    s3_store: S3TranscriptStore, s3_client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # S3 caps DeleteObjects at 1000 keys; a batch of 2 exercises the batching without
    # writing a thousand objects.
    monkeypatch.setattr("storage.s3_transcripts._DELETE_BATCH", 2)
    for i in range(1, 6):
        s3_client.put_object(Bucket=bucket, Key=compaction_key(REF, i), Body=b"")

    assert await s3_store.delete_session(REF) == 5
    assert s3_client.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


# --- S3: what an append and a read cost ------------------------------------------------------


def meter(store: S3TranscriptStore) -> Counter[str]:
    """Count what the store's client sends from now on: requests by operation (retries
    included) and the bytes of the request bodies (`bytes_sent`)."""
    sent: Counter[str] = Counter()

    def count(request: Any, event_name: str, **_: Any) -> None:
        sent[event_name.rsplit(".", 1)[-1]] += 1
        sent["bytes_sent"] += int(request.headers.get("Content-Length", 0))

    store._client.meta.events.register("before-send.s3", count)
    return sent


def s3_stores(s3_endpoint: str, boto_session: Any, bucket: str, n: int) -> list[S3TranscriptStore]:
    """`n` stores on one bucket, like `n` gateway processes: no lock or memory in common."""
    return [
        S3TranscriptStore(bucket, endpoint_url=s3_endpoint, boto_session=boto_session)
        for _ in range(n)
    ]


async def test_s3_an_append_is_one_put_of_the_new_lines_and_no_get(
    s3_store: S3TranscriptStore,
) -> None:
    await s3_store.append_lines(REF, [line(1)], first_seq=1)
    sent = meter(s3_store)

    await s3_store.append_lines(REF, [line(2)], first_seq=2)
    await s3_store.append_lines(REF, [line(3), line(4)], first_seq=3)
    await s3_store.append_lines(REF, [], first_seq=5)

    assert sent == {
        "PutObject": 2,
        "bytes_sent": len(encode_lines([line(2)])) + len(encode_lines([line(3), line(4)])),
    }
    assert parse_transcript(await s3_store.read_transcript(REF)) == [line(i) for i in range(1, 5)]


async def test_s3_the_10000th_append_costs_what_the_10th_did(
    s3_store: S3TranscriptStore, s3_client: Any, bucket: str
) -> None:
    short, long = SessionRef("acme", "alice", "short"), SessionRef("acme", "alice", "long")
    for first_seq in range(1, 9, 2):
        await s3_store.append_lines(short, turn(first_seq), first_seq=first_seq)
    # 9,998 messages: most in a legacy object (one PUT to make), the last turns as segments.
    legacy = [line for first_seq in range(1, 9_991, 2) for line in turn(first_seq)]
    s3_client.put_object(Bucket=bucket, Key=legacy_transcript_key(long), Body=encode_lines(legacy))
    for first_seq in range(9_991, 9_999, 2):
        await s3_store.append_lines(long, turn(first_seq), first_seq=first_seq)

    sent = meter(s3_store)
    costs = []
    for ref, first_seq in [(short, 9), (long, 9_999)]:
        before = sent.copy()
        await s3_store.append_lines(ref, turn(first_seq), first_seq=first_seq)
        costs.append(dict(sent - before))

    assert costs[0] == costs[1] == {"PutObject": 1, "bytes_sent": len(encode_lines(turn(1)))}
    lines = parse_transcript(await s3_store.read_transcript(long))
    assert len(lines) == 10_000
    assert lines[-2:] == turn(9_999)


async def test_s3_a_put_resent_after_its_answer_was_lost_leaves_one_copy(
    s3_store: S3TranscriptStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What botocore does when a PUT's answer is lost: it sends the same request again.
    real_put = s3_store._client.put_object

    def put_twice(**params: Any) -> Any:
        real_put(**params)
        return real_put(**params)

    monkeypatch.setattr(s3_store._client, "put_object", put_twice)
    await s3_store.append_lines(REF, [line(1)], first_seq=1)
    await s3_store.append_lines(REF, [line(2), line(3)], first_seq=2)

    assert parse_transcript(await s3_store.read_transcript(REF)) == [line(1), line(2), line(3)]


async def test_s3_two_processes_appending_in_turn_write_every_line_once_in_order(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> None:
    # Turns of one session answered by two gateway processes: neither reads the other's
    # writes, and neither has to.
    stores = s3_stores(s3_endpoint, boto_session, bucket, 2)
    sent = [meter(store) for store in stores]
    for i in range(1, 9):
        await stores[i % 2].append_lines(REF, [line(i)], first_seq=i)

    assert parse_transcript(await stores[0].read_transcript(REF)) == [line(i) for i in range(1, 9)]
    assert sent[1]["PutObject"] == 4
    assert "GetObject" not in sent[1]
    for store in stores:
        store.close()


async def test_s3_appends_from_two_processes_at_once_lose_no_line(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> None:
    stores = s3_stores(s3_endpoint, boto_session, bucket, 2)
    await asyncio.gather(
        *(stores[i % 2].append_lines(REF, [line(i)], first_seq=i) for i in range(1, 11))
    )

    lines = parse_transcript(await stores[0].read_transcript(REF))

    assert lines == [line(i) for i in range(1, 11)]
    for store in stores:
        store.close()


async def test_s3_reading_a_transcript_lists_once_and_gets_only_its_objects(
    s3_store: S3TranscriptStore, s3_client: Any, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key=legacy_transcript_key(REF), Body=encode_lines(turn(1)))
    for first_seq in [3, 5, 7]:
        await s3_store.append_lines(REF, turn(first_seq), first_seq=first_seq)
    await s3_store.write_archive(pre_compact_archive_key(REF, 1), encode_lines(turn(1)))
    await s3_store.write_archive(compaction_key(REF, 1), b"{}")
    sent = meter(s3_store)

    lines = parse_transcript(await s3_store.read_transcript(REF))

    assert lines == turn(1) + turn(3) + turn(5) + turn(7)
    assert sent["ListObjectsV2"] == 1
    assert sent["GetObject"] == 4


async def test_s3_a_transcript_is_read_with_bounded_concurrency(
    s3_endpoint: str, boto_session: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = S3TranscriptStore(
        bucket, endpoint_url=s3_endpoint, boto_session=boto_session, read_concurrency=3
    )
    for first_seq in range(1, 13):
        await store.append_lines(REF, [line(first_seq)], first_seq=first_seq)
    real_get = store._client.get_object
    guard = threading.Lock()
    in_flight, most = 0, 0

    def slow_get(**params: Any) -> Any:
        nonlocal in_flight, most
        with guard:
            in_flight += 1
            most = max(most, in_flight)
        try:
            time.sleep(0.02)  # long enough for the other reads to pile up behind the bound
            return real_get(**params)
        finally:
            with guard:
                in_flight -= 1

    monkeypatch.setattr(store._client, "get_object", slow_get)
    lines = parse_transcript(await store.read_transcript(REF))

    assert lines == [line(i) for i in range(1, 13)]
    assert most == 3
    store.close()


async def test_s3_a_segment_missing_between_listing_and_reading_is_an_error(
    s3_store: S3TranscriptStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await s3_store.append_lines(REF, [line(1)], first_seq=1)
    real_list = s3_store._list

    def list_a_segment_deleted_since(prefix: str) -> list[str]:
        return [*real_list(prefix), segment(REF, 2)]

    monkeypatch.setattr(s3_store, "_list", list_a_segment_deleted_since)

    with pytest.raises(StorageError, match="does not exist") as raised:
        await s3_store.read_transcript(REF)
    assert raised.value.key == segment(REF, 2)
