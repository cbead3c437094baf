"""The S3 store (moto over HTTP): its checks of the bucket and the endpoint, errors that name
the key and the cause, KMS encryption, the key prefix on the real objects and deletes in
batches."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from errors import StorageError
from storage.s3_transcripts import S3TranscriptStore
from storage.transcripts import (
    compaction_key,
    incoming_file_key,
    legacy_transcript_key,
    parse_transcript,
)
from tests.storage.transcript_samples import REF, line, segment


async def test_s3_check_names_a_missing_bucket(s3_endpoint: str, boto_session: Any) -> None:
    store = S3TranscriptStore(
        "no-such-bucket-here", endpoint_url=s3_endpoint, boto_session=boto_session
    )
    with pytest.raises(StorageError, match="S3 bucket 'no-such-bucket-here' does not exist"):
        await store.check()
    await store.close()


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
    await store.close()


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
    await store.close()


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
    await store.close()

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
    await store.close()


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


async def test_s3_lists_the_stash_by_age_and_deletes_one_object(
    s3_store: S3TranscriptStore,
) -> None:
    key = incoming_file_key("f00d")
    await s3_store.write_archive(key, b"bytes")
    await s3_store.write_archive(compaction_key(REF, 1), b"{}")  # not the stash's
    now = datetime.now(UTC)
    assert await s3_store.list_incoming(now + timedelta(minutes=1)) == [key]
    assert await s3_store.list_incoming(now - timedelta(hours=1)) == []
    await s3_store.delete(key)
    await s3_store.delete(key)  # gone already: not an error
    assert await s3_store.list_incoming(now + timedelta(minutes=1)) == []
