"""The S3 backend of `TranscriptStore` (AWS S3 or any S3-compatible server).

boto3 is blocking, so every call (including reading a response body and walking a paginator)
runs in a worker thread via `asyncio.to_thread`; the event loop never waits on the network.
Every botocore error becomes a `StorageError` naming the key and the cause.

S3 has no append, so `append_lines` reads the transcript and writes old + new back with a
conditional PUT (`If-Match` on the ETag it read, `If-None-Match: *` when there was none) and
retries when another writer got there first. Within one process appends to a key are also
serialised by a lock, so retries only happen between processes. A server without conditional
writes that answers 501 NotImplemented makes the append fail with a `StorageError` saying so
rather than risk losing lines; a server that silently ignores the headers cannot be detected,
and then only the in-process lock protects concurrent appends.

To make an append one request instead of two, the store remembers the bytes and ETag it last
wrote (or read while appending) for each transcript, in an LRU cache bounded by total bytes.
An append to a remembered transcript skips the GET and PUTs remembered + new with `If-Match`
on the remembered ETag; if another process wrote or deleted the object meanwhile, that PUT
fails its precondition, the entry is dropped and the append falls back to GET + PUT. Deleting
through the store drops the deleted keys' entries too. The cache is only as safe as the
server's `If-Match`: on a server that ignores it, pass `cache_bytes=0`, or a stale entry would
overwrite other processes' lines and bring a transcript deleted elsewhere back.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
)

from errors import ArchiveExistsError, StorageError
from storage.transcripts import (
    KeyedLocks,
    SessionRef,
    StoredObject,
    TranscriptLine,
    check_key,
    encode_lines,
    session_prefix,
    transcript_key,
    user_prefix,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

T = TypeVar("T")

_SSE_MODES = frozenset({"AES256", "aws:kms", "aws:kms:dsse"})
_MISSING_KEY_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket", "404", "NotFound"})
# 412: our If-Match / If-None-Match lost; 409: a concurrent conditional write was in flight.
_WRITE_CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_DELETE_BATCH = 1000  # the most keys DeleteObjects accepts in one request
_DEFAULT_CACHE_BYTES = 16 * 1024 * 1024


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _is_write_conflict(exc: ClientError) -> bool:
    return _error_code(exc) in _WRITE_CONFLICT_CODES or _status(exc) in {409, 412}


def _backoff(attempt: int) -> float:
    """Full-jitter backoff, capped: competing writers stop colliding in lockstep."""
    return random.uniform(0, min(0.5, 0.02 * 2**attempt))  # noqa: S311 - jitter, not secrets


def _storage_error(
    operation: str, key: str | None, exc: ClientError | BotoCoreError
) -> StorageError:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        cause = f"{error.get('Code', 'unknown')}: {error.get('Message', '')}".rstrip(": ")
    else:
        cause = str(exc)
    return StorageError(f"S3 {operation} failed: {cause}", key=key)


@dataclass(frozen=True, slots=True)
class _KnownObject:
    """The bytes of an object as this process last saw them, and the ETag S3 gave them."""

    data: bytes
    etag: str


class _KnownObjects:
    """The last known state of transcript objects, least recently used first, bounded in bytes.

    Only the bodies count towards the bound; an object bigger than the bound is not kept.
    Used from the event loop only, so it needs no lock of its own.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self.size_bytes = 0
        self._entries: OrderedDict[str, _KnownObject] = OrderedDict()

    def __contains__(self, object_key: str) -> bool:
        return object_key in self._entries

    def pop(self, object_key: str) -> _KnownObject | None:
        """Remove and return the entry: whoever takes it puts back what it finds next."""
        known = self._entries.pop(object_key, None)
        if known is not None:
            self.size_bytes -= len(known.data)
        return known

    def put(self, object_key: str, data: bytes, etag: str | None) -> None:
        """Remember `data` as the object's content (the most recent entry); evict to fit."""
        self.pop(object_key)
        if etag is None or len(data) > self.max_bytes:
            return
        self._entries[object_key] = _KnownObject(data, etag)
        self.size_bytes += len(data)
        while self.size_bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.size_bytes -= len(evicted.data)

    def discard_prefix(self, prefix: str) -> None:
        """Forget every object whose key starts with `prefix`."""
        for object_key in [k for k in self._entries if k.startswith(prefix)]:
            self.pop(object_key)


class S3TranscriptStore:
    """A `TranscriptStore` in an S3 bucket under an optional prefix, with optional SSE."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        sse: str | None = None,
        kms_key_id: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_attempts: int = 3,
        append_attempts: int = 10,
        cache_bytes: int = _DEFAULT_CACHE_BYTES,
        boto_session: boto3.session.Session | None = None,
    ) -> None:
        """Create the (thread-safe) boto3 client once; credentials come from the usual chain.

        `max_attempts` is botocore's total attempts per request (1 = no retries);
        `append_attempts` bounds the read-modify-write rounds of one `append_lines`.
        `cache_bytes` bounds the transcripts remembered to skip the GET of an append
        (0 turns that off; see the module docstring).
        `boto_session` lets several stores share one session (and its loaded service models);
        by default each store makes its own.
        """
        if not bucket:
            raise StorageError("S3 bucket name is empty")
        if sse is not None and sse not in _SSE_MODES:
            raise StorageError(
                f"unknown S3 server-side encryption {sse!r}: use {sorted(_SSE_MODES)}"
            )
        if kms_key_id and sse not in {"aws:kms", "aws:kms:dsse"}:
            raise StorageError("S3 kms_key_id is set but sse is not 'aws:kms'")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._sse: dict[str, str] = {}
        if sse:
            self._sse["ServerSideEncryption"] = sse
            if kms_key_id:
                self._sse["SSEKMSKeyId"] = kms_key_id
        self._append_attempts = max(1, append_attempts)
        config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"total_max_attempts": max(1, max_attempts), "mode": "standard"},
        )
        # Not boto3's global default session: sessions are not safe to share across threads.
        session = boto_session or boto3.session.Session()
        self._client: S3Client = session.client(
            "s3", region_name=region, endpoint_url=endpoint_url, config=config
        )
        self._locks = KeyedLocks()
        self._known = _KnownObjects(cache_bytes)

    def close(self) -> None:
        """Close the client's connection pool."""
        self._client.close()

    def _object_key(self, key: str) -> str:
        """Map a layout key (or a layout prefix ending in `/`) to the key in the bucket."""
        check_key(key.removesuffix("/"))
        return f"{self.prefix}/{key}" if self.prefix else key

    def _layout_key(self, object_key: str) -> str:
        return object_key[len(self.prefix) + 1 :] if self.prefix else object_key

    async def _run(self, operation: str, key: str | None, call: Callable[[], T]) -> T:
        """Run a blocking boto3 call in a worker thread, turning its errors into StorageError."""
        try:
            return await asyncio.to_thread(call)
        except (ClientError, BotoCoreError) as exc:
            raise _storage_error(operation, key, exc) from exc

    async def append_lines(self, ref: SessionRef, lines: Sequence[TranscriptLine]) -> None:
        """Append lines by conditional read-modify-write of `transcript.jsonl`.

        When this process knows the transcript's bytes and ETag, the read is skipped.
        """
        if not lines:
            return
        key = transcript_key(ref)
        object_key = self._object_key(key)
        data = encode_lines(lines)
        async with self._locks.for_key(object_key):
            expected: bytes | None = None
            known = self._known.pop(object_key)
            if known is not None:
                expected = known.data + data
                if await self._put_transcript(key, object_key, expected, known.etag):
                    return
                # Someone else wrote or deleted it (or our own PUT was retried): read it.
            for attempt in range(self._append_attempts):
                old, etag = await self._run("get_object", key, lambda: self._get(object_key))
                # A conflict can also be our own PUT: botocore retries a request whose answer
                # was lost, and the retry fails its precondition. If what we meant to write is
                # there, the append happened; writing it again would duplicate the lines.
                if expected is not None and old.startswith(expected):
                    self._known.put(object_key, old, etag)
                    return
                expected = old + data
                if await self._put_transcript(key, object_key, expected, etag):
                    return
                await asyncio.sleep(_backoff(attempt))
        raise StorageError(
            f"S3 append gave up after {self._append_attempts} attempts: "
            "other writers kept changing the transcript",
            key=key,
        )

    async def _put_transcript(
        self, key: str, object_key: str, body: bytes, etag: str | None
    ) -> bool:
        """PUT `body` if the object still has `etag` (or, for None, does not exist).

        Returns False when the precondition failed, and then remembers nothing; on success the
        body and its new ETag are remembered for the next append.
        """
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": object_key, **self._sse}
        params["Body"] = body
        params["ContentType"] = "application/x-ndjson"
        if etag is None:
            params["IfNoneMatch"] = "*"
        else:
            params["IfMatch"] = etag
        try:
            response = await asyncio.to_thread(functools.partial(self._client.put_object, **params))
        except ClientError as exc:
            # NoSuchKey: the object vanished since it was read (If-Match on a missing key).
            if _is_write_conflict(exc) or _error_code(exc) == "NoSuchKey":
                return False
            if _error_code(exc) == "NotImplemented" or _status(exc) == 501:
                raise StorageError(
                    "S3 server does not support conditional writes (If-Match / "
                    "If-None-Match), so appends cannot be made safe",
                    key=key,
                ) from exc
            raise _storage_error("put_object", key, exc) from exc
        except BotoCoreError as exc:
            raise _storage_error("put_object", key, exc) from exc
        self._known.put(object_key, body, response.get("ETag"))
        return True

    def _get(self, object_key: str) -> tuple[bytes, str | None]:
        """GET an object and its ETag; a missing object reads as empty with no ETag."""
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=object_key)
        except ClientError as exc:
            if _error_code(exc) == "NoSuchKey":
                return b"", None
            raise
        return response["Body"].read(), response["ETag"]

    async def write_archive(self, key: str, data: bytes) -> StoredObject:
        """PUT with `If-None-Match: *`, so an existing archive is never overwritten."""
        object_key = self._object_key(key)
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": object_key, **self._sse}
        params.update(Body=data, IfNoneMatch="*")
        # Only a missing key can be written, so whatever was remembered for it is gone.
        self._known.pop(object_key)
        for attempt in range(self._append_attempts):
            try:
                await asyncio.to_thread(functools.partial(self._client.put_object, **params))
            except ClientError as exc:
                if _error_code(exc) == "PreconditionFailed" or _status(exc) == 412:
                    raise ArchiveExistsError("archive already exists", key=key) from exc
                if _is_write_conflict(exc):
                    # 409: another write of this key is in flight and may still fail; ask again.
                    await asyncio.sleep(_backoff(attempt))
                    continue
                raise _storage_error("put_object", key, exc) from exc
            except BotoCoreError as exc:
                raise _storage_error("put_object", key, exc) from exc
            return StoredObject(key=key, size=len(data))
        raise StorageError("S3 archive write kept conflicting with another writer", key=key)

    async def read(self, key: str) -> bytes:
        """Return the object's bytes; a missing object raises `StorageError` saying so."""
        object_key = self._object_key(key)

        def get() -> bytes:
            return self._client.get_object(Bucket=self.bucket, Key=object_key)["Body"].read()

        try:
            return await asyncio.to_thread(get)
        except ClientError as exc:
            if _error_code(exc) in _MISSING_KEY_CODES:
                raise StorageError(
                    f"S3 object s3://{self.bucket}/{object_key} does not exist", key=key
                ) from exc
            raise _storage_error("get_object", key, exc) from exc
        except BotoCoreError as exc:
            raise _storage_error("get_object", key, exc) from exc

    async def stat(self, key: str) -> StoredObject | None:
        """HEAD the object: its size, or None when it does not exist."""
        object_key = self._object_key(key)
        try:
            head = await asyncio.to_thread(
                lambda: self._client.head_object(Bucket=self.bucket, Key=object_key)
            )
        except ClientError as exc:
            if _error_code(exc) in _MISSING_KEY_CODES:
                return None
            raise _storage_error("head_object", key, exc) from exc
        except BotoCoreError as exc:
            raise _storage_error("head_object", key, exc) from exc
        return StoredObject(key=key, size=head["ContentLength"])

    async def list_session(self, ref: SessionRef) -> list[str]:
        """Return the layout keys of every object of the session, sorted."""
        prefix = session_prefix(ref)
        object_keys = await self._run("list_objects_v2", prefix, lambda: self._list(prefix))
        return sorted(self._layout_key(k) for k in object_keys)

    def _list(self, prefix: str) -> list[str]:
        """List every object key (with the store prefix) under a layout prefix; paginates."""
        paginator = self._client.get_paginator("list_objects_v2")
        keys: list[str] = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._object_key(prefix)):
            keys.extend(obj["Key"] for obj in page.get("Contents", []) if "Key" in obj)
        return keys

    async def delete_session(self, ref: SessionRef) -> int:
        """Delete every object of the session; return how many were deleted."""
        return await self._delete_prefix(session_prefix(ref))

    async def delete_user(self, org_id: str, user_id: str) -> int:
        """Delete every object of all the user's sessions; return how many were deleted."""
        return await self._delete_prefix(user_prefix(org_id, user_id))

    async def _delete_prefix(self, prefix: str) -> int:
        # Objects written after the listing survive; callers delete once writers have stopped.
        object_keys = await self._run("list_objects_v2", prefix, lambda: self._list(prefix))
        try:
            for start in range(0, len(object_keys), _DELETE_BATCH):
                batch = object_keys[start : start + _DELETE_BATCH]
                errors = await self._run(
                    "delete_objects", prefix, functools.partial(self._delete_batch, batch)
                )
                if errors:
                    shown = "; ".join(errors[:3])
                    raise StorageError(
                        f"S3 delete_objects failed for {len(errors)} object(s): {shown}",
                        key=prefix,
                    )
        finally:
            # Even when a batch failed: a deleted transcript must never be written back from
            # memory. If-Match would refuse that PUT anyway; this does not rely on it.
            self._known.discard_prefix(self._object_key(prefix))
        return len(object_keys)

    def _delete_batch(self, object_keys: list[str]) -> list[str]:
        """Delete up to 1000 objects in one request; return a description of each failure."""
        response = self._client.delete_objects(
            Bucket=self.bucket,
            Delete={"Objects": [{"Key": k} for k in object_keys], "Quiet": True},
        )
        # DeleteObjects answers 200 even when some keys failed; the failures are in Errors.
        return [
            f"{e.get('Key')}: {e.get('Code')} {e.get('Message', '')}".strip()
            for e in response.get("Errors", [])
        ]

    async def check(self) -> None:
        """HEAD the bucket: it must exist and these credentials must reach it."""
        endpoint = self._client.meta.endpoint_url
        try:
            await asyncio.to_thread(lambda: self._client.head_bucket(Bucket=self.bucket))
        except ClientError as exc:
            code = _error_code(exc)
            if code in _MISSING_BUCKET_CODES:
                raise StorageError(f"S3 bucket {self.bucket!r} does not exist") from exc
            if code in {"403", "AccessDenied", "Forbidden"}:
                raise StorageError(f"access to S3 bucket {self.bucket!r} is denied") from exc
            raise _storage_error(f"head_bucket on {self.bucket!r}", None, exc) from exc
        except (EndpointConnectionError, ConnectTimeoutError) as exc:
            raise StorageError(f"cannot reach S3 endpoint {endpoint}: {exc}") from exc
        except NoCredentialsError as exc:
            raise StorageError(f"no AWS credentials for S3 bucket {self.bucket!r}") from exc
        except BotoCoreError as exc:
            raise _storage_error(f"head_bucket on {self.bucket!r}", None, exc) from exc
