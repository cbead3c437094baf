"""A small object's PUT without boto3's request pipeline: botocore signs it, aiohttp sends it.

A transcript segment is written after every turn, so its PUT is on the gateway's hottest path.
Through boto3 it costs about 3 CPU-ms (parameter validation, the endpoint rule set, the event
hooks, the user-agent string built twice, urllib3, and the worker thread boto3 needs); signed
here with botocore's own SigV4 signer (`S3SigV4Auth`) and sent with aiohttp on the event loop,
about 1.2. Everything a deployment configures still comes from the boto3 client: the URL
(endpoint, addressing style, region) is the client's own presigned URL for a probe key with
the probe cut off, the credentials are the session's (refreshed in a worker thread when they
are due, never on the loop), the region is the client's.

`SignedPut.put` retries what botocore's standard mode retries (connection errors, timeouts,
500/502/503/504, the transient and throttling codes) and a 429, with full-jitter backoff, and
says `GaveUp` when every attempt failed so. Any other answer may be a difference between this
path and boto3 (a bucket in another region, a certificate only botocore trusts, an auth scheme
S3 asks for): `put` returns it as a `Refusal` and the caller sends the same PUT through boto3,
whose answer is the one that counts.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import random
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import aiohttp
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, RefreshableCredentials
from yarl import URL

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# The request headers of boto3's `put_object` parameters this path sends.
SSE_HEADERS = {
    "ServerSideEncryption": "x-amz-server-side-encryption",
    "SSEKMSKeyId": "x-amz-server-side-encryption-aws-kms-key-id",
}
_PROBE_KEY = "probe"
# What botocore's standard retry mode retries (`botocore/retries/standard.py`: its transient
# statuses, transient and throttling codes), and a bare 429.
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_RETRY_CODES = frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "EC2ThrottledException",
    }
)
_MAX_ERROR_BODY = 64 * 1024


@dataclass(frozen=True)
class Refusal:
    """An answer boto3 may handle differently: the status, S3's error code and message."""

    status: int
    code: str
    message: str


@dataclass(frozen=True)
class GaveUp:
    """Every attempt met an error worth retrying; `cause` says the last one."""

    cause: str


def _backoff(attempt: int) -> float:
    """Full jitter, doubling from 0.1 s up to 2 s (botocore's standard mode doubles from 1 s
    up to 20 s; a segment waits behind its own retries only, and a burst should clear fast)."""
    return random.uniform(0, min(2.0, 0.05 * 2**attempt))  # noqa: S311 - jitter, not secrets


def _error_of(status: int, body: bytes) -> Refusal:
    """S3's XML error (`<Error><Code>…<Message>…`), or the bare status when there is none."""
    code = message = ""
    try:
        root = ET.fromstring(body[:_MAX_ERROR_BODY])  # noqa: S314 - see the import
    except ET.ParseError:
        root = None
    if root is not None:
        code = root.findtext("Code") or ""
        message = root.findtext("Message") or ""
    return Refusal(status=status, code=code or str(status), message=message)


def env_proxy(url: str) -> tuple[URL | None, dict[str, str] | None]:
    """The proxy the environment names for `url` (`HTTPS_PROXY`/`HTTP_PROXY`, unless
    `NO_PROXY` exempts its host) and the headers that log in to it (its URL's credentials);
    looked up once, as botocore does when it makes a client."""
    parts = urlsplit(url)
    if parts.hostname is None or urllib.request.proxy_bypass(parts.hostname):
        return None, None
    named = urllib.request.getproxies().get(parts.scheme)
    if not named:
        return None, None
    proxy = URL(named if "://" in named else f"http://{named}")
    if proxy.user is None:
        return proxy, None
    login = aiohttp.encode_basic_auth(proxy.user, proxy.password or "")
    return proxy.with_user(None), {"Proxy-Authorization": login}


class SignedPut:
    """PUTs of small bodies to one bucket, signed as the boto3 `client` would sign them."""

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        credentials: Credentials,
        *,
        headers: dict[str, str],
        connect_timeout: float,
        read_timeout: float,
        max_attempts: int,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        """Find the bucket's base URL through the client; `headers` go on every request;
        `trace_configs` are aiohttp's request hooks (metering).

        Raises `ValueError` when the client's URL for a key does not end with the key (an
        endpoint this path does not understand): the caller then keeps to boto3.
        """
        probe = client.generate_presigned_url(
            "put_object", Params={"Bucket": bucket, "Key": _PROBE_KEY}, ExpiresIn=60
        )
        parts = urlsplit(probe)
        if not parts.path.endswith("/" + _PROBE_KEY):
            raise ValueError(f"unexpected S3 URL shape {parts.scheme}://{parts.netloc}{parts.path}")
        self._base = f"{parts.scheme}://{parts.netloc}{parts.path[: -len(_PROBE_KEY)]}"
        self._region = client.meta.region_name or "us-east-1"
        self._credentials = credentials
        self._headers = headers
        self._timeout = aiohttp.ClientTimeout(sock_connect=connect_timeout, sock_read=read_timeout)
        self._max_attempts = max(1, max_attempts)
        self._trace_configs = list(trace_configs)
        self._proxy, self._proxy_headers = env_proxy(self._base)
        self._http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        """Close the connection pool (if one was opened)."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        """The connection pool, opened on first use in the running loop. Not `trust_env`:
        that looks the proxy and `.netrc` up again in two worker threads for every request;
        the environment's proxy was looked up once (`env_proxy`)."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=self._timeout, trace_configs=self._trace_configs
            )
        return self._http

    async def _frozen_credentials(self) -> Any:
        """The credentials to sign with; a refresh (a network call) runs in a worker thread."""
        credentials = self._credentials
        if isinstance(credentials, RefreshableCredentials) and credentials.refresh_needed():
            return await asyncio.to_thread(credentials.get_frozen_credentials)
        return credentials.get_frozen_credentials()

    async def _signed(self, url: str, body: bytes, content_type: str) -> dict[str, str]:
        headers = {
            **self._headers,
            "Content-Type": content_type,
            "Content-MD5": base64.b64encode(
                hashlib.md5(body, usedforsecurity=False).digest()
            ).decode("ascii"),
        }
        request = AWSRequest(method="PUT", url=url, data=body, headers=headers)
        S3SigV4Auth(await self._frozen_credentials(), "s3", self._region).add_auth(request)
        return dict(request.headers.items())

    async def put(self, object_key: str, body: bytes, content_type: str) -> Refusal | GaveUp | None:
        """PUT `body` at `object_key`: None once stored, a `Refusal` for boto3 to send again,
        `GaveUp` when every attempt met an error worth retrying."""
        url = self._base + quote(object_key, safe="/~")
        cause = ""
        for attempt in range(self._max_attempts):
            if attempt:
                await asyncio.sleep(_backoff(attempt))
            # Signed again on each attempt: the signature's time must stay fresh.
            headers = await self._signed(url, body, content_type)
            try:
                async with self._session().put(
                    URL(url, encoded=True),
                    data=body,
                    headers=headers,
                    proxy=self._proxy,
                    proxy_headers=self._proxy_headers,
                ) as response:
                    answer = await response.read()
                    status = response.status
            except aiohttp.ClientSSLError as exc:
                return Refusal(status=0, code="TLS", message=str(exc))
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
                cause = f"{type(exc).__name__}: {exc}"
                continue
            except aiohttp.ClientError as exc:  # e.g. a URL aiohttp will not send
                return Refusal(status=0, code=type(exc).__name__, message=str(exc))
            if 200 <= status < 300:
                return None
            refusal = _error_of(status, answer)
            if status in _RETRY_STATUSES or refusal.code in _RETRY_CODES:
                cause = f"{refusal.code}: {refusal.message}".rstrip(": ")
                continue
            return refusal
        return GaveUp(cause)
