"""The S3 store's requests, counted on the client: an append is one PUT of the new lines
whatever the session's length, a read lists once and fetches only the transcript's objects
(a bounded number at a time), and stores in several processes append without reading each
other's writes or losing a line."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
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


class S3Meter:
    """Counts what its stores send from `start()` on: requests by operation (retries
    included) and the bytes of the request bodies (`bytes_sent`), on both of a store's paths:
    boto3's (its `before-send` event) and the segments' signed PUT (aiohttp's trace hooks)."""

    def __init__(self) -> None:
        self._counters: list[Counter[str]] = []
        self.trace = aiohttp.TraceConfig()
        self.trace.on_request_start.append(self._http_request)
        self.trace.on_request_chunk_sent.append(self._http_chunk)

    def store(self, s3_endpoint: str, boto_session: Any, bucket: str) -> S3TranscriptStore:
        """A store on `bucket` whose requests this meter counts."""
        store = S3TranscriptStore(
            bucket,
            endpoint_url=s3_endpoint,
            boto_session=boto_session,
            http_trace_configs=[self.trace],
        )
        store._client.meta.events.register("before-send.s3", self._boto_request)
        return store

    def start(self) -> Counter[str]:
        """A counter of what is sent from now on."""
        self._counters.append(Counter())
        return self._counters[-1]

    def _count(self, name: str, amount: int) -> None:
        for counter in self._counters:
            counter[name] += amount

    def _boto_request(self, request: Any, event_name: str, **_: Any) -> None:
        self._count(event_name.rsplit(".", 1)[-1], 1)
        self._count("bytes_sent", int(request.headers.get("Content-Length", 0)))

    async def _http_request(self, _session: Any, _context: Any, params: Any) -> None:
        assert params.method == "PUT"  # the signed path sends segments and nothing else
        self._count("PutObject", 1)

    async def _http_chunk(self, _session: Any, _context: Any, params: Any) -> None:
        self._count("bytes_sent", len(params.chunk))


@pytest.fixture
async def metered(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> AsyncIterator[tuple[S3TranscriptStore, S3Meter]]:
    """A store on the test bucket and the meter that counts its requests."""
    meter = S3Meter()
    store = meter.store(s3_endpoint, boto_session, bucket)
    yield store, meter
    await store.close()


async def test_s3_an_append_is_one_put_of_the_new_lines_and_no_get(
    metered: tuple[S3TranscriptStore, S3Meter],
) -> None:
    s3_store, meter = metered
    await s3_store.append_lines(REF, [line(1)], first_seq=1)
    sent = meter.start()

    await s3_store.append_lines(REF, [line(2)], first_seq=2)
    await s3_store.append_lines(REF, [line(3), line(4)], first_seq=3)
    await s3_store.append_lines(REF, [], first_seq=5)

    assert sent == {
        "PutObject": 2,
        "bytes_sent": len(encode_lines([line(2)])) + len(encode_lines([line(3), line(4)])),
    }
    assert parse_transcript(await s3_store.read_transcript(REF)) == [line(i) for i in range(1, 5)]


async def test_s3_the_10000th_append_costs_what_the_10th_did(
    metered: tuple[S3TranscriptStore, S3Meter], s3_client: Any, bucket: str
) -> None:
    s3_store, meter = metered
    short, long = SessionRef("acme", "alice", "short"), SessionRef("acme", "alice", "long")
    for first_seq in range(1, 9, 2):
        await s3_store.append_lines(short, turn(first_seq), first_seq=first_seq)
    # 9,998 messages: most in a legacy object (one PUT to make), the last turns as segments.
    legacy = [line for first_seq in range(1, 9_991, 2) for line in turn(first_seq)]
    s3_client.put_object(Bucket=bucket, Key=legacy_transcript_key(long), Body=encode_lines(legacy))
    for first_seq in range(9_991, 9_999, 2):
        await s3_store.append_lines(long, turn(first_seq), first_seq=first_seq)

    sent = meter.start()
    costs = []
    for ref, first_seq in [(short, 9), (long, 9_999)]:
        before = sent.copy()
        await s3_store.append_lines(ref, turn(first_seq), first_seq=first_seq)
        costs.append(dict(sent - before))

    assert costs[0] == costs[1] == {"PutObject": 1, "bytes_sent": len(encode_lines(turn(1)))}
    lines = parse_transcript(await s3_store.read_transcript(long))
    assert len(lines) == 10_000
    assert lines[-2:] == turn(9_999)


async def test_s3_two_processes_appending_in_turn_write_every_line_once_in_order(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> None:
    # Turns of one session answered by two gateway processes: neither reads the other's
    # writes, and neither has to.
    # `n` stores on one bucket, like `n` gateway processes: no lock or memory in common.
    meters = [S3Meter(), S3Meter()]
    stores = [meter.store(s3_endpoint, boto_session, bucket) for meter in meters]
    sent = [meter.start() for meter in meters]
    for i in range(1, 9):
        await stores[i % 2].append_lines(REF, [line(i)], first_seq=i)

    assert parse_transcript(await stores[0].read_transcript(REF)) == [line(i) for i in range(1, 9)]
    assert sent[1]["PutObject"] == 4
    assert "GetObject" not in sent[1]
    for store in stores:
        await store.close()


async def test_s3_appends_from_two_processes_at_once_lose_no_line(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> None:
    stores = [S3Meter().store(s3_endpoint, boto_session, bucket) for _ in range(2)]
    await asyncio.gather(
        *(stores[i % 2].append_lines(REF, [line(i)], first_seq=i) for i in range(1, 11))
    )

    lines = parse_transcript(await stores[0].read_transcript(REF))

    assert lines == [line(i) for i in range(1, 11)]
    for store in stores:
        await store.close()


async def test_s3_reading_a_transcript_lists_once_and_gets_only_its_objects(
    metered: tuple[S3TranscriptStore, S3Meter], s3_client: Any, bucket: str
) -> None:
    s3_store, meter = metered
    s3_client.put_object(Bucket=bucket, Key=legacy_transcript_key(REF), Body=encode_lines(turn(1)))
    for first_seq in [3, 5, 7]:
        await s3_store.append_lines(REF, turn(first_seq), first_seq=first_seq)
    await s3_store.write_archive(pre_compact_archive_key(REF, 1), encode_lines(turn(1)))
    await s3_store.write_archive(compaction_key(REF, 1), b"{}")
    sent = meter.start()

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
    await store.close()


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
