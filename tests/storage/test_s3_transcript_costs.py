"""The S3 store's requests, counted on the client: an append is one PUT of the new lines
whatever the session's length, a read lists once and fetches only the transcript's objects
(a bounded number at a time), and stores in several processes append without reading each
other's writes or losing a line."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest

from errors import StorageError
from storage.s3_transcripts import S3TranscriptStore
from storage.transcripts import (
    SessionRef,
    compaction_key,
    encode_lines,
    legacy_transcript_key,
    parse_transcript,
    pre_compact_archive_key,
)
from tests.storage.transcript_samples import REF, line, segment, turn


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
