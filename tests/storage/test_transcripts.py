"""The transcript store: the same behaviour on a local folder and on S3 (moto over HTTP)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from errors import ArchiveExistsError, StorageError
from storage.s3_transcripts import S3TranscriptStore
from storage.transcripts import (
    LocalTranscriptStore,
    SessionRef,
    StoredObject,
    TranscriptLine,
    TranscriptStore,
    compaction_key,
    encode_lines,
    parse_transcript,
    pre_compact_archive_key,
    session_prefix,
    transcript_key,
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
    assert transcript_key(REF) == "sessions/acme/alice/s1/transcript.jsonl"
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
    await store.append_lines(REF, [line(1), line(2)])
    await store.append_lines(REF, [line(3)])
    await store.append_lines(REF, [])
    await store.append_lines(REF, [line(4), line(5, "ünïcødé \u2028 and\nnewline")])

    data = await store.read(transcript_key(REF))

    assert parse_transcript(data) == [
        line(1),
        line(2),
        line(3),
        line(4),
        line(5, "ünïcødé \u2028 and\nnewline"),
    ]
    assert data.count(b"\n") == 5
    assert data.endswith(b"\n")


async def test_objects_are_stored_under_the_layout_keys(store: TranscriptStore) -> None:
    await store.append_lines(REF, [line(1)])
    await store.write_archive(compaction_key(REF, 1), b"{}")
    await store.write_archive(pre_compact_archive_key(REF, 1), b"x\n")

    assert await store.list_session(REF) == [
        "sessions/acme/alice/s1/archive/full_transcript_pre_compact_001.jsonl",
        "sessions/acme/alice/s1/compact_001.json",
        "sessions/acme/alice/s1/transcript.jsonl",
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
    await store.append_lines(REF, [line(1)])
    await store.append_lines(neighbour, [line(1)])
    await store.append_lines(SessionRef("acme", "bob", "s1"), [line(1)])

    assert await store.list_session(REF) == [transcript_key(REF)]
    assert await store.list_session(SessionRef("acme", "alice", "none")) == []


async def test_delete_session_removes_only_that_session(store: TranscriptStore) -> None:
    other = SessionRef("acme", "alice", "s10")
    await store.append_lines(REF, [line(1)])
    await store.write_archive(compaction_key(REF, 1), b"{}")
    await store.write_archive(pre_compact_archive_key(REF, 1), b"x")
    await store.append_lines(other, [line(1)])

    assert await store.delete_session(REF) == 3

    assert await store.list_session(REF) == []
    assert await store.list_session(other) == [transcript_key(other)]
    assert await store.delete_session(REF) == 0


async def test_delete_user_removes_all_their_sessions_and_nothing_else(
    store: TranscriptStore,
) -> None:
    alice = [SessionRef("acme", "alice", f"s{i}") for i in range(3)]
    bob = SessionRef("acme", "bob", "s1")
    alice_elsewhere = SessionRef("other-org", "alice", "s1")
    for ref in [*alice, bob, alice_elsewhere]:
        await store.append_lines(ref, [line(1)])
    await store.write_archive(compaction_key(alice[0], 1), b"{}")

    assert await store.delete_user("acme", "alice") == 4

    for ref in alice:
        assert await store.list_session(ref) == []
    assert await store.list_session(bob) == [transcript_key(bob)]
    assert await store.list_session(alice_elsewhere) == [transcript_key(alice_elsewhere)]


async def test_concurrent_appends_lose_no_line(store: TranscriptStore) -> None:
    await asyncio.gather(*(store.append_lines(REF, [line(i)]) for i in range(20)))

    lines = parse_transcript(await store.read(transcript_key(REF)))

    assert sorted(lines, key=lambda x: x.tokens) == [line(i) for i in range(20)]


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


async def test_local_write_archive_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalTranscriptStore(tmp_path)
    key = compaction_key(REF, 1)
    await store.write_archive(key, b"one")
    with pytest.raises(ArchiveExistsError):
        await store.write_archive(key, b"two")

    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files == [key]


async def test_local_delete_removes_the_folders_it_empties(tmp_path: Path) -> None:
    store = LocalTranscriptStore(tmp_path)
    await store.write_archive(pre_compact_archive_key(REF, 1), b"x")
    await store.append_lines(SessionRef("acme", "bob", "s1"), [line(1)])

    await store.delete_session(REF)
    assert not (tmp_path / "sessions/acme/alice").exists()
    assert (tmp_path / "sessions/acme/bob/s1").is_dir()

    await store.delete_user("acme", "bob")
    assert list(tmp_path.iterdir()) == []


async def test_local_appends_from_two_stores_on_one_folder_lose_no_line(tmp_path: Path) -> None:
    first, second = LocalTranscriptStore(tmp_path), LocalTranscriptStore(tmp_path)
    await asyncio.gather(
        *((first if i % 2 else second).append_lines(REF, [line(i)]) for i in range(20))
    )
    assert len(parse_transcript(await first.read(transcript_key(REF)))) == 20


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
    with pytest.raises(StorageError, match="NoSuchBucket"):
        await store.append_lines(REF, [line(1)])  # a missing bucket is not an empty transcript
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
    await store.append_lines(REF, [line(1)])
    await store.write_archive(compaction_key(REF, 1), b"{}")
    store.close()

    for key in [transcript_key(REF), compaction_key(REF, 1)]:
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
    await store.append_lines(REF, [line(1)])
    await store.write_archive(compaction_key(REF, 1), b"{}")

    listed = s3_client.list_objects_v2(Bucket=bucket)
    assert sorted(obj["Key"] for obj in listed["Contents"]) == [
        expected + compaction_key(REF, 1),
        expected + transcript_key(REF),
    ]
    assert await store.list_session(REF) == [compaction_key(REF, 1), transcript_key(REF)]
    assert await store.delete_user("acme", "alice") == 2
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


async def test_s3_appends_from_two_processes_lose_no_line(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> None:
    # Two store objects have separate in-process locks, like two gateway processes: only the
    # conditional writes (If-Match / If-None-Match) keep their read-modify-writes apart.
    stores = [
        S3TranscriptStore(
            bucket, endpoint_url=s3_endpoint, boto_session=boto_session, append_attempts=30
        )
        for _ in range(2)
    ]
    await asyncio.gather(*(stores[i % 2].append_lines(REF, [line(i)]) for i in range(10)))

    lines = parse_transcript(await stores[0].read(transcript_key(REF)))

    assert sorted(x.tokens for x in lines) == list(range(10))
    for store in stores:
        store.close()


async def test_s3_append_whose_success_was_reported_as_a_conflict_is_not_repeated(
    s3_store: S3TranscriptStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What botocore does when a PUT's answer is lost: it resends, and the resend fails its
    # If-Match because the first one landed. The store must see its lines there and stop.
    real_put = s3_store._client.put_object
    calls = []

    def put_then_report_conflict(**params: Any) -> Any:
        response = real_put(**params)
        calls.append(params["Key"])
        if len(calls) == 2:
            raise ClientError(
                {"Error": {"Code": "PreconditionFailed", "Message": "At least one failed"}},
                "PutObject",
            )
        return response

    monkeypatch.setattr(s3_store._client, "put_object", put_then_report_conflict)
    await s3_store.append_lines(REF, [line(1)])
    await s3_store.append_lines(REF, [line(2)])

    assert parse_transcript(await s3_store.read(transcript_key(REF))) == [line(1), line(2)]
    assert len(calls) == 2


# --- S3: remembering the last written transcript ---------------------------------------------


def count_requests(store: S3TranscriptStore) -> dict[str, int]:
    """Count the S3 operations the store's client sends from now on, by operation name."""
    counts: dict[str, int] = {}

    def count(model: Any, **_: Any) -> None:
        counts[model.name] = counts.get(model.name, 0) + 1

    store._client.meta.events.register("before-call.s3.*", count)
    return counts


def s3_stores(s3_endpoint: str, boto_session: Any, bucket: str, n: int) -> list[S3TranscriptStore]:
    """`n` stores on one bucket, like `n` gateway processes: no lock or memory in common."""
    return [
        S3TranscriptStore(bucket, endpoint_url=s3_endpoint, boto_session=boto_session)
        for _ in range(n)
    ]


async def test_s3_append_after_the_first_is_one_put_and_no_get(
    s3_store: S3TranscriptStore,
) -> None:
    await s3_store.append_lines(REF, [line(1)])
    requests = count_requests(s3_store)

    await s3_store.append_lines(REF, [line(2)])
    await s3_store.append_lines(REF, [line(3), line(4)])

    assert requests == {"PutObject": 2}
    data = await s3_store.read(transcript_key(REF))
    assert parse_transcript(data) == [line(1), line(2), line(3), line(4)]


async def test_s3_two_processes_appending_in_turn_write_every_line_once_in_order(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> None:
    # Each append finds the other store's write since its own last one: its remembered ETag is
    # stale, the conditional PUT fails, and it must read again rather than drop those lines.
    stores = s3_stores(s3_endpoint, boto_session, bucket, 2)
    requests = [count_requests(store) for store in stores]
    for i in range(8):
        await stores[i % 2].append_lines(REF, [line(i)])

    assert parse_transcript(await stores[0].read(transcript_key(REF))) == [
        line(i) for i in range(8)
    ]
    # Every append after each store's first was refused once, then read and written.
    assert requests[0]["PutObject"] == 1 + 2 * 3
    for store in stores:
        store.close()


@pytest.mark.parametrize("delete", ["session", "user"])
async def test_s3_append_after_a_delete_through_the_store_starts_a_new_transcript(
    s3_store: S3TranscriptStore, delete: str
) -> None:
    await s3_store.append_lines(REF, [line(1), line(2)])
    if delete == "session":
        await s3_store.delete_session(REF)
    else:
        await s3_store.delete_user(REF.org_id, REF.user_id)
    requests = count_requests(s3_store)

    await s3_store.append_lines(REF, [line(3)])

    # The delete made the store forget the transcript: it reads, and no PUT is refused.
    assert requests == {"GetObject": 1, "PutObject": 1}
    assert parse_transcript(await s3_store.read(transcript_key(REF))) == [line(3)]


async def test_s3_append_after_a_delete_behind_the_stores_back_starts_a_new_transcript(
    s3_store: S3TranscriptStore, s3_client: Any, bucket: str
) -> None:
    # Another process deleted the session: this store still remembers the old bytes and ETag.
    await s3_store.append_lines(REF, [line(1), line(2)])
    s3_client.delete_object(Bucket=bucket, Key=transcript_key(REF))

    await s3_store.append_lines(REF, [line(3)])

    assert parse_transcript(await s3_store.read(transcript_key(REF))) == [line(3)]


async def test_s3_append_after_an_overwrite_behind_the_stores_back_keeps_the_new_content(
    s3_store: S3TranscriptStore, s3_client: Any, bucket: str
) -> None:
    await s3_store.append_lines(REF, [line(1), line(2)])
    replaced = (line(7).to_json() + "\n").encode()
    s3_client.put_object(Bucket=bucket, Key=transcript_key(REF), Body=replaced)

    await s3_store.append_lines(REF, [line(3)])

    assert parse_transcript(await s3_store.read(transcript_key(REF))) == [line(7), line(3)]


async def test_s3_remembered_transcripts_stay_within_the_byte_bound(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> None:
    bound = 2000  # room for about a dozen one-line transcripts
    store = S3TranscriptStore(
        bucket, endpoint_url=s3_endpoint, boto_session=boto_session, cache_bytes=bound
    )
    refs = [SessionRef("acme", "alice", f"s{i}") for i in range(40)]
    for ref in refs:
        await store.append_lines(ref, [line(1)])
        assert store._known.size_bytes <= bound
    assert store._known.size_bytes > bound - len(encode_lines([line(1)]))

    # The least recently written were forgotten and are read again; the latest were not.
    requests = count_requests(store)
    await store.append_lines(refs[-1], [line(2)])
    assert requests == {"PutObject": 1}
    await store.append_lines(refs[0], [line(2)])
    assert requests == {"PutObject": 2, "GetObject": 1}
    assert store._known.size_bytes <= bound
    store.close()


async def test_s3_a_transcript_bigger_than_the_bound_is_not_remembered(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> None:
    store = S3TranscriptStore(
        bucket, endpoint_url=s3_endpoint, boto_session=boto_session, cache_bytes=1000
    )
    await store.append_lines(SessionRef("acme", "bob", "s1"), [line(1)])
    await store.append_lines(REF, [line(2, "x" * 1000)])
    requests = count_requests(store)

    await store.append_lines(REF, [line(3)])

    assert requests == {"GetObject": 1, "PutObject": 1}
    assert store._known.size_bytes <= 1000
    # The small transcript was not evicted to make room for one that could never fit.
    assert store._object_key(transcript_key(SessionRef("acme", "bob", "s1"))) in store._known
    store.close()


async def test_s3_with_no_cache_every_append_reads_first(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> None:
    store = S3TranscriptStore(
        bucket, endpoint_url=s3_endpoint, boto_session=boto_session, cache_bytes=0
    )
    requests = count_requests(store)
    for i in range(3):
        await store.append_lines(REF, [line(i)])

    assert requests == {"GetObject": 3, "PutObject": 3}
    assert store._known.size_bytes == 0
    store.close()
