"""The segments' signed PUT (`storage.s3_put`) against a real HTTP front on loopback that
forwards to moto: its signature is the one botocore computes for the request as it arrived,
throttling is retried, an answer only boto3 handles sends the segment through boto3 (which
the store then keeps to), and a failure names its cause."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import aiohttp
import pytest
from aiohttp import web
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from structlog.testing import capture_logs
from yarl import URL

from errors import StorageError
from storage.s3_put import env_proxy
from storage.s3_transcripts import S3TranscriptStore
from storage.transcripts import SessionRef, parse_transcript
from tests.storage.transcript_samples import REF, line, segment

# An answer the front gives instead of forwarding: (status, S3 error code), or None.
Rule = Callable[[web.Request], tuple[int, str] | None]


def _error_body(code: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>{code} from the front</Message></Error>"
    ).encode()


@dataclass
class S3Front:
    """An HTTP server in front of moto: it records every request, checks each SigV4
    signature against botocore's for the request as received, and answers by `rule`."""

    upstream: str
    rule: Rule = lambda _request: None
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, agent
    bad_signatures: list[str] = field(default_factory=list)
    url: str = ""
    # PUTs forwarded whose answers are then lost (the connection dropped before it).
    lost_answers: int = 0
    # The absolute URLs of the requests that came to it as a proxy.
    proxied: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        agent = request.headers.get("User-Agent", "")
        raw_path = request.raw_path
        if raw_path.startswith("http://"):  # absolute form: sent to us as the client's proxy
            self.proxied.append(raw_path)
            raw_path = "/" + raw_path.split("/", 3)[3]
        self.requests.append((request.method, raw_path, agent))
        self._check_signature(request, raw_path, body)
        answer = self.rule(request)
        if answer is not None:
            status, code = answer
            return web.Response(status=status, body=_error_body(code))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in {"host"}}
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                request.method,
                self.upstream + raw_path,
                data=body,
                headers=headers,
                skip_auto_headers=["Content-Type"],
            ) as forwarded,
        ):
            data = await forwarded.read()
            keep = {"ETag", "Content-Type", "x-amz-request-id"}
            out = {k: v for k, v in forwarded.headers.items() if k in keep}
        if request.method == "PUT" and self.lost_answers > 0:
            self.lost_answers -= 1
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=500)  # never reaches the client
        return web.Response(status=forwarded.status, body=data, headers=out)

    def _check_signature(self, request: web.Request, raw_path: str, body: bytes) -> None:
        """Sign the request as it arrived, at its own time, and compare: what S3 does."""
        authorization = request.headers.get("Authorization", "")
        if not authorization.startswith("AWS4-HMAC-SHA256 "):
            return  # not a header-signed request (e.g. a presigned URL); not ours to check
        fields = dict(
            part.strip().split("=", 1) for part in authorization.split(" ", 1)[1].split(",")
        )
        signed = fields["SignedHeaders"].split(";")
        region = fields["Credential"].split("/")[2]
        headers = {name: request.headers[name] for name in signed if name in request.headers}
        # S3 signs the key in its canonical form: decoded, then every byte but A-Z a-z 0-9
        # - . _ ~ and the slashes encoded; a client that encodes otherwise is refused.
        path, _, query = raw_path.partition("?")
        canonical = quote(unquote(path), safe="/~") + (f"?{query}" if query else "")
        probe = AWSRequest(
            method=request.method,
            url=f"http://{request.host}{canonical}",
            data=body,
            headers=headers,
        )
        probe.context["timestamp"] = request.headers["X-Amz-Date"]
        creds = ReadOnlyCredentials(
            "testing", "testing", request.headers.get("X-Amz-Security-Token")
        )
        auth = S3SigV4Auth(creds, "s3", region)
        expected = auth.signature(auth.string_to_sign(probe, auth.canonical_request(probe)), probe)
        if fields["Signature"] != expected:
            self.bad_signatures.append(f"{request.method} {request.raw_path}")

    def puts(self, *, by_boto3: bool) -> list[str]:
        """The paths of the PUTs received from boto3 (its user agent) or from the signed path."""
        return [
            path
            for method, path, agent in self.requests
            if method == "PUT" and ("Botocore" in agent) == by_boto3
        ]


@pytest.fixture
async def front(s3_endpoint: str) -> AsyncIterator[S3Front]:
    front = S3Front(upstream=s3_endpoint)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", front.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    front.url = f"http://127.0.0.1:{port}"
    yield front
    await runner.cleanup()


StoreFactory = Callable[..., S3TranscriptStore]


@pytest.fixture
async def make_store(front: S3Front, boto_session: Any, bucket: str) -> AsyncIterator[StoreFactory]:
    """Stores on the test bucket through the front (options as keywords), closed at the end."""
    made: list[S3TranscriptStore] = []

    def make(**options: Any) -> S3TranscriptStore:
        options.setdefault("endpoint_url", front.url)
        made.append(S3TranscriptStore(bucket, boto_session=boto_session, **options))
        return made[-1]

    yield make
    for store in made:
        await store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> S3TranscriptStore:
    return make_store()


async def test_a_segment_is_one_signed_put_that_s3_would_accept(
    front: S3Front, make_store: StoreFactory, bucket: str, s3_client: Any
) -> None:
    # Characters an id or the configured prefix may hold, which the URL carries encoded.
    store = make_store(prefix="tenant a/é~x")
    ref = SessionRef("acme.corp", "ana+bo@example.com", "s1_x-y")
    await store.append_lines(ref, [line(1)], first_seq=1)
    await store.append_lines(ref, [line(2), line(3)], first_seq=2)

    assert len(front.puts(by_boto3=False)) == 2
    assert front.puts(by_boto3=True) == []
    assert front.bad_signatures == []
    assert parse_transcript(await store.read_transcript(ref)) == [line(1), line(2), line(3)]
    listed = s3_client.list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(item["Key"] for item in listed) == [
        "tenant a/é~x/" + segment(ref, 1),
        "tenant a/é~x/" + segment(ref, 2),
    ]


async def test_a_segment_put_with_encryption_carries_it(
    front: S3Front, make_store: StoreFactory, bucket: str, s3_client: Any
) -> None:
    await make_store(sse="AES256").append_lines(REF, [line(1)], first_seq=1)

    assert len(front.puts(by_boto3=False)) == 1
    assert front.bad_signatures == []
    head = s3_client.head_object(Bucket=bucket, Key=segment(REF, 1))
    assert head["ServerSideEncryption"] == "AES256"


async def test_a_throttled_segment_put_is_sent_again(
    front: S3Front, store: S3TranscriptStore
) -> None:
    answers = iter([(503, "SlowDown"), (500, "InternalError")])
    front.rule = lambda request: next(answers, None) if request.method == "PUT" else None

    await store.append_lines(REF, [line(1)], first_seq=1)

    assert len(front.puts(by_boto3=False)) == 3
    assert front.bad_signatures == []
    assert parse_transcript(await store.read_transcript(REF)) == [line(1)]


async def test_a_put_whose_answer_was_lost_is_sent_again_and_leaves_one_copy(
    front: S3Front, store: S3TranscriptStore, s3_client: Any, bucket: str
) -> None:
    front.lost_answers = 1

    await store.append_lines(REF, [line(1)], first_seq=1)
    await store.append_lines(REF, [line(2), line(3)], first_seq=2)

    assert len(front.puts(by_boto3=False)) == 3
    assert parse_transcript(await store.read_transcript(REF)) == [line(1), line(2), line(3)]
    listed = s3_client.list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(item["Key"] for item in listed) == [segment(REF, 1), segment(REF, 2)]


async def test_a_segment_put_that_keeps_failing_names_the_cause(
    front: S3Front, store: S3TranscriptStore
) -> None:
    front.rule = lambda request: (503, "SlowDown") if request.method == "PUT" else None

    with pytest.raises(StorageError, match="S3 put_object failed: SlowDown") as raised:
        await store.append_lines(REF, [line(1)], first_seq=1)

    assert raised.value.key == segment(REF, 1)
    assert len(front.puts(by_boto3=False)) == 3  # the store's default attempts


async def test_a_refused_signed_put_goes_through_boto3_which_the_store_then_keeps_to(
    front: S3Front, store: S3TranscriptStore
) -> None:
    # As a bucket in another region answers a request signed for the configured one: boto3
    # follows such answers, the signed path does not.
    def refuse_the_signed_path(request: web.Request) -> tuple[int, str] | None:
        signed_path = "Botocore" not in request.headers.get("User-Agent", "")
        return (400, "AuthorizationHeaderMalformed") if signed_path else None

    front.rule = refuse_the_signed_path

    with capture_logs() as entries:
        await store.append_lines(REF, [line(1)], first_seq=1)
        await store.append_lines(REF, [line(2)], first_seq=2)

    assert len(front.puts(by_boto3=False)) == 1
    boto3_puts = [path.rsplit("/", 1)[-1] for path in front.puts(by_boto3=True)]
    assert boto3_puts == ["0000000001.jsonl", "0000000002.jsonl"]
    assert [(e["event"], e["status"], e["code"]) for e in entries] == [
        ("transcripts.signed_put_off", 400, "AuthorizationHeaderMalformed")
    ]
    assert parse_transcript(await store.read_transcript(REF)) == [line(1), line(2)]


async def test_a_put_refused_both_ways_is_an_error_and_the_signed_path_stays(
    front: S3Front, store: S3TranscriptStore
) -> None:
    front.rule = lambda request: (403, "AccessDenied") if request.method == "PUT" else None

    for first_seq in (1, 2):
        with pytest.raises(StorageError, match="AccessDenied"):
            await store.append_lines(REF, [line(first_seq)], first_seq=first_seq)

    # Each append tried the signed path first: a refusal boto3 shares turns nothing off.
    assert len(front.puts(by_boto3=False)) == 2
    assert len(front.puts(by_boto3=True)) == 2


async def test_an_unreachable_endpoint_is_retried_then_named(make_store: StoreFactory) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = make_store(endpoint_url=f"http://127.0.0.1:{port}", connect_timeout=0.5, max_attempts=2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(StorageError, match="S3 put_object failed: ClientConnectorError"):
        await store.append_lines(REF, [line(1)], first_seq=1)
    assert loop.time() - started < 5


def proxy_environment(monkeypatch: pytest.MonkeyPatch, proxy: str, no_proxy: str = "") -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    if no_proxy:
        monkeypatch.setenv("NO_PROXY", no_proxy)


async def test_a_segment_put_goes_through_the_proxy_the_environment_names(
    front: S3Front, make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy_environment(monkeypatch, front.url)
    # An address nothing answers at (TEST-NET-1): only the proxy can reach it.
    store = make_store(endpoint_url="http://192.0.2.1:9", max_attempts=1)
    await store.append_lines(REF, [line(1)], first_seq=1)
    assert front.puts(by_boto3=False) == ["/" + front.requests[0][1].split("/", 1)[1]]
    assert front.proxied == [f"http://192.0.2.1:9{front.requests[0][1]}"]
    assert front.bad_signatures == []


def test_the_proxy_is_the_environments_unless_its_host_is_exempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy_environment(monkeypatch, "http://ana:s%40id@proxy.example:3128", no_proxy=".internal")
    proxy, headers = env_proxy("http://s3.example.com/bucket/")
    assert str(proxy) == "http://proxy.example:3128"
    assert headers == {"Proxy-Authorization": aiohttp.encode_basic_auth("ana", "s@id")}
    assert env_proxy("http://s3.internal/bucket/") == (None, None)
    assert env_proxy("https://s3.example.com/bucket/") == (None, None)  # HTTP's only
    proxy_environment(monkeypatch, "proxy.example:3128")
    assert env_proxy("http://s3.example.com/")[0] == URL("http://proxy.example:3128")
