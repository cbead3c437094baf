"""The S3 backend of `TranscriptStore` (AWS S3 or any S3-compatible server).

boto3 is blocking, so every call (including reading a response body and walking a paginator)
runs in a worker thread via `asyncio.to_thread`; the event loop never waits on the network.
Every botocore error becomes a `StorageError` naming the key and the cause.

S3 has no append, so a transcript is append-only segments (see `storage.transcripts`):
`append_lines` is one unconditional PUT of a new object `transcript/{first_seq:010d}.jsonl`, no
GET, and costs the same for the 10,000th message of a session as for the 10th. That PUT runs
after every turn, so it goes through `storage.s3_put` (botocore's signer, aiohttp on the event
loop, no worker thread) rather than boto3's pipeline; a segment that path is refused is sent
again through boto3, and when boto3 then succeeds the store keeps to boto3 from then on. The
key comes from the database's sequence number, unique in the session, so the only second write
of a key is a retry of the same batch (a PUT sent again because its answer was lost, or the gateway
appending a turn again); it carries the same lines, so overwriting is harmless, and it needs
neither `If-None-Match` (whose retry would come back 412 and need interpreting) nor a server
that supports conditional writes. `read_transcript` lists the session's transcript objects and
GETs them concurrently (at most `read_concurrency` at once), legacy `transcript.jsonl` first.

Archives (`write_archive`) are the objects that must never be overwritten: they are PUT with
`If-None-Match: *`, and a 409 from a concurrent conditional write is retried.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import boto3
import structlog
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
)

from errors import ArchiveExistsError, StorageError
from storage.s3_put import SSE_HEADERS, GaveUp, Refusal, SignedPut
from storage.transcripts import (
    INCOMING_PREFIX,
    SessionRef,
    StoredObject,
    TranscriptLine,
    check_key,
    encode_lines,
    join_transcript,
    session_prefix,
    transcript_keys,
    transcript_segment_key,
    user_prefix,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

T = TypeVar("T")

log = structlog.stdlib.get_logger(__name__)

SEGMENT_CONTENT_TYPE = "application/x-ndjson"

_SSE_MODES = frozenset({"AES256", "aws:kms", "aws:kms:dsse"})
_MISSING_KEY_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket", "404", "NotFound"})
# 412: our If-None-Match lost; 409: a concurrent conditional write was in flight.
_WRITE_CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_DELETE_BATCH = 1000  # the most keys DeleteObjects accepts in one request
# Below botocore's default pool of 10 connections, so concurrent GETs never open and discard
# connections beyond the pool, and the default thread pool keeps room for other work.
_DEFAULT_READ_CONCURRENCY = 8


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
        conflict_attempts: int = 10,
        read_concurrency: int = _DEFAULT_READ_CONCURRENCY,
        boto_session: boto3.session.Session | None = None,
        http_trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        """Create the (thread-safe) boto3 client once; credentials come from the usual chain.

        `max_attempts` is botocore's total attempts per request (1 = no retries);
        `conflict_attempts` bounds the tries of an archive write that keeps meeting another
        conditional write of the same key (409);
        `read_concurrency` bounds the GETs of one `read_transcript` in flight at once.
        `boto_session` lets several stores share one session (and its loaded service models);
        by default each store makes its own.
        `http_trace_configs` are aiohttp's request hooks on the segments' PUTs (metering).
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
        self._conflict_attempts = max(1, conflict_attempts)
        self._read_concurrency = max(1, read_concurrency)
        self._timeouts = (connect_timeout, read_timeout, max(1, max_attempts))
        config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"total_max_attempts": max(1, max_attempts), "mode": "standard"},
        )
        # Not boto3's global default session: sessions are not safe to share across threads.
        self._session = boto_session or boto3.session.Session()
        self._client: S3Client = self._session.client(
            "s3", region_name=region, endpoint_url=endpoint_url, config=config
        )
        # The segments' PUT path (`storage.s3_put`): opened on the first append, in a worker
        # thread (finding the credentials may ask the network); off for good once boto3 has
        # succeeded where it was refused.
        self._signed_put: SignedPut | None = None
        self._signed_put_off = False
        self._signed_put_opening = asyncio.Lock()
        self._http_trace_configs = tuple(http_trace_configs)

    async def close(self) -> None:
        """Close the connection pools."""
        if self._signed_put is not None:
            await self._signed_put.close()
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

    async def append_lines(
        self, ref: SessionRef, lines: Sequence[TranscriptLine], *, first_seq: int
    ) -> None:
        """PUT the segment named by `first_seq`: one request, no GET (see the module docstring)."""
        key = transcript_segment_key(ref, first_seq)
        if not lines:
            return
        object_key, body = self._object_key(key), encode_lines(lines)
        refusal: Refusal | None = None
        signed_put = await self._open_signed_put()
        if signed_put is not None:
            answer = await signed_put.put(object_key, body, SEGMENT_CONTENT_TYPE)
            if answer is None:
                return
            if isinstance(answer, GaveUp):
                raise StorageError(f"S3 put_object failed: {answer.cause}", key=key)
            refusal = answer
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": object_key, **self._sse}
        params.update(Body=body, ContentType=SEGMENT_CONTENT_TYPE)
        await self._run("put_object", key, functools.partial(self._client.put_object, **params))
        if refusal is not None and not self._signed_put_off:
            # boto3 managed what the signed PUT was refused: this deployment needs boto3.
            self._signed_put_off = True
            log.warning(
                "transcripts.signed_put_off",
                status=refusal.status,
                code=refusal.code,
                detail=refusal.message,
            )

    async def _open_signed_put(self) -> SignedPut | None:
        """The segments' PUT path, opened once; None when it is off (boto3 then PUTs)."""
        if self._signed_put is None and not self._signed_put_off:
            async with self._signed_put_opening:
                if self._signed_put is None and not self._signed_put_off:
                    self._signed_put = await asyncio.to_thread(self._new_signed_put)
                    self._signed_put_off = self._signed_put is None
        return None if self._signed_put_off else self._signed_put

    def _new_signed_put(self) -> SignedPut | None:
        credentials = self._session.get_credentials()
        if credentials is None:
            return None  # boto3's own PUT says so, in its words
        connect_timeout, read_timeout, max_attempts = self._timeouts
        headers = {SSE_HEADERS[name]: value for name, value in self._sse.items()}
        try:
            return SignedPut(
                self._client,
                self.bucket,
                credentials,
                headers=headers,
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                max_attempts=max_attempts,
                trace_configs=self._http_trace_configs,
            )
        except (ValueError, BotoCoreError) as exc:
            log.warning("transcripts.signed_put_off", detail=str(exc))
            return None

    async def read_transcript(self, ref: SessionRef) -> bytes:
        """List the transcript's objects, GET them concurrently (bounded), join them in order."""
        # One listing finds both the legacy `transcript.jsonl` and the segments `transcript/…`,
        # and skips the session's archives and files; `transcript_keys` drops anything else.
        prefix = session_prefix(ref) + "transcript"
        object_keys = await self._run("list_objects_v2", prefix, lambda: self._list(prefix))
        keys = transcript_keys(ref, (self._layout_key(k) for k in object_keys))
        slots = asyncio.Semaphore(self._read_concurrency)

        async def read_one(key: str) -> bytes:
            async with slots:
                return await self.read(key)

        return join_transcript(await asyncio.gather(*(read_one(key) for key in keys)))

    async def write_archive(self, key: str, data: bytes) -> StoredObject:
        """PUT with `If-None-Match: *`, so an existing archive is never overwritten."""
        object_key = self._object_key(key)
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": object_key, **self._sse}
        params.update(Body=data, IfNoneMatch="*")
        for attempt in range(self._conflict_attempts):
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

    async def delete(self, key: str) -> None:
        """DELETE the object (S3 answers the same whether it existed or not)."""
        object_key = self._object_key(key)
        await self._run(
            "delete_object",
            key,
            functools.partial(self._client.delete_object, Bucket=self.bucket, Key=object_key),
        )

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

    async def list_incoming(self, before: datetime) -> list[str]:
        """Return the stash's keys whose object was last written before `before`."""

        def older() -> list[str]:
            paginator = self._client.get_paginator("list_objects_v2")
            keys = []
            pages = paginator.paginate(Bucket=self.bucket, Prefix=self._object_key(INCOMING_PREFIX))
            for page in pages:
                for item in page.get("Contents", []):
                    if "Key" in item and item["LastModified"] < before:
                        keys.append(self._layout_key(item["Key"]))
            return keys

        return await self._run("list_objects_v2", INCOMING_PREFIX, older)

    async def delete_session(self, ref: SessionRef) -> int:
        """Delete every object of the session; return how many were deleted."""
        return await self._delete_prefix(session_prefix(ref))

    async def delete_user(self, org_id: str, user_id: str) -> int:
        """Delete every object of all the user's sessions; return how many were deleted."""
        return await self._delete_prefix(user_prefix(org_id, user_id))

    async def _delete_prefix(self, prefix: str) -> int:
        # Objects written after the listing survive; callers delete once writers have stopped.
        object_keys = await self._run("list_objects_v2", prefix, lambda: self._list(prefix))
        for start in range(0, len(object_keys), _DELETE_BATCH):
            batch = object_keys[start : start + _DELETE_BATCH]
            errors = await self._run(
                "delete_objects", prefix, functools.partial(self._delete_batch, batch)
            )
            if errors:
                shown = "; ".join(errors[:3])
                raise StorageError(
                    f"S3 delete_objects failed for {len(errors)} object(s): {shown}", key=prefix
                )
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
