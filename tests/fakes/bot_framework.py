"""A fake Bot Framework on a loopback port, for the real botbuilder SDK and the Teams channel.

It serves an OpenID metadata document and a JWKS with a test RSA key (endorsed for `msteams`),
an OAuth2 token endpoint (client credentials → a bearer token it remembers), and a Bot
Connector (`/{region}/v3/conversations/{id}/activities[/{activityId}]`) that records every
activity posted with a token it issued (`posted`: messages; `typing`: typing activities, with
their entities), and can be told to fail the next posts (429 with Retry-After, 503, 404 …).
`mint_token` makes real RS256 JWTs like the channel service's.

Files: `add_content` holds an inline image the connector serves under the service URL
(`/{region}/v3/attachments/{id}/views/original`, only with a token it issued), and
`add_shared_file` a OneDrive/SharePoint file behind a pre-authenticated download URL
(`/sharepoint/{name}?tempauth=…`, no bearer token needed); `file_requests` records each
download (path and Authorization header).

Streams behave as Teams documents them for personal chats: a `typing` activity with a
`streaminfo` entity and no `streamId` starts a stream (201, its id is the stream id), later
updates name it and carry a greater `streamSequence` and text that extends the last streamed
text (202), and a `message` with `streamType: final` ends it; anything sent to an ended
stream is refused with 403 `ContentStreamNotAllowed`, as are the requests after the user's
Stop (`stop_streams_after`), after the two minutes (`expire_stream`) and to a bot that may not
stream (`refuse_streaming`). Breaches of the protocol are answered 400 and kept in
`stream_errors`; `too_fast` lists requests to one conversation less than a second apart.

It runs with uvicorn inside the test's event loop: `async with FakeBotFramework() as fake:`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.file_server import ServedFile, file_response

APP_ID = "2b7e6a0c-3f4d-4c1a-9e2b-5d6f7a8b9c0d"
APP_PASSWORD = "fake-app-password"
ISSUER = "https://api.botframework.com"
KEY_ID = "fake-key-1"
TEMPAUTH = "v1.fake-tempauth"


@functools.cache
def signing_key() -> rsa.RSAPrivateKey:
    """The key whose public half the fake publishes (generated once per test run)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@functools.cache
def stranger_key() -> rsa.RSAPrivateKey:
    """A key the fake does not publish: tokens signed with it must be refused."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PostedActivity:
    """One activity the connector received."""

    conversation_id: str
    reply_to_id: str | None
    body: dict[str, Any]
    authorization: str | None
    received_at: float = 0.0  # time.monotonic() when it arrived

    @property
    def stream_info(self) -> dict[str, Any] | None:
        """The activity's `streaminfo` entity, if it has one."""
        for entity in self.body.get("entities") or ():
            if isinstance(entity, dict) and entity.get("type") == "streaminfo":
                return entity
        return None


@dataclass
class Failure:
    """A scripted answer to the next connector post."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeStream:
    """A stream the connector opened: its chat, last sequence and text, and how it ended."""

    stream_id: str
    conversation_id: str
    sequence: int = 0
    text: str = ""
    updates: int = 0
    ended: str = ""  # "", "final", "stopped" (the user's Stop) or "expired"
    started_at: float = 0.0  # time.monotonic() of the request that opened it


@dataclass
class Refusal:
    """An error answer of the connector."""

    status: int
    code: str
    message: str


STREAM_REFUSED = "ContentStreamNotAllowed"


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class FakeBotFramework:
    """The fake; `url` is its base, `service_url` what activities name as their serviceUrl."""

    def __init__(self, *, app_id: str = APP_ID, app_password: str = APP_PASSWORD) -> None:
        self.app_id = app_id
        self.app_password = app_password
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.posted: list[PostedActivity] = []
        self.token_requests: list[dict[str, str]] = []
        self.metadata_requests = 0
        self.failures: deque[Failure] = deque()
        self.typing: list[PostedActivity] = []
        self.requests: list[tuple[str, float]] = []  # (conversation without reply chain, time)
        self.streams: dict[str, FakeStream] = {}
        self.stream_errors: list[str] = []
        self.stop_after: int | None = None
        self.streaming_refused = False
        self.content: dict[str, ServedFile] = {}
        self.shared_files: dict[str, ServedFile] = {}
        self.file_requests: list[tuple[str, str | None]] = []
        self._changed = asyncio.Event()
        self._issued: set[str] = set()
        self._ids = itertools.count(1)
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def openid_metadata_url(self) -> str:
        return f"{self.url}/v1/.well-known/openidconfiguration"

    @property
    def token_url(self) -> str:
        return f"{self.url}/botframework.com/oauth2/v2.0/token"

    @property
    def service_url(self) -> str:
        return f"{self.url}/amer/"

    def add_content(self, attachment_id: str, served: ServedFile) -> str:
        """Hold an inline image; its `contentUrl` (under the service URL)."""
        self.content[attachment_id] = served
        return f"{self.service_url}v3/attachments/{attachment_id}/views/original"

    def add_shared_file(self, served: ServedFile) -> str:
        """Hold a shared OneDrive/SharePoint file; its pre-authenticated `downloadUrl`."""
        self.shared_files[served.name] = served
        return f"{self.url}/sharepoint/{served.name}?tempauth={TEMPAUTH}"

    def revoke_tokens(self) -> None:
        """Refuse every token issued so far (as after the app's secret was rotated)."""
        self._issued.clear()

    def fail_next(self, status: int, headers: dict[str, str] | None = None) -> None:
        """Answer the next connector post with `status` (and headers)."""
        self.failures.append(Failure(status, headers or {}))

    def stop_streams_after(self, updates: int) -> None:
        """The user presses Stop once a stream has had `updates` updates: every later request
        to it (update or final) is refused with 403 `ContentStreamNotAllowed`."""
        self.stop_after = updates

    def expire_stream(self, stream_id: str) -> None:
        """The stream's two minutes are over: later requests to it are refused (403)."""
        self.streams[stream_id].ended = "expired"

    def refuse_streaming(self) -> None:
        """Streaming is not allowed for this bot: a request that starts a stream gets 403."""
        self.streaming_refused = True

    def too_fast(self, interval: float = 1.0) -> list[tuple[str, float]]:
        """Requests that came less than `interval` seconds after the previous one to the same
        conversation: (conversation, gap)."""
        last: dict[str, float] = {}
        found = []
        for conversation, at in self.requests:
            if conversation in last and at - last[conversation] < interval:
                found.append((conversation, at - last[conversation]))
            last[conversation] = at
        return found

    def finals(self) -> list[PostedActivity]:
        """The messages that ended a stream."""
        return [
            post for post in self.posted if (post.stream_info or {}).get("streamType") == "final"
        ]

    async def wait_for(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        """Return once `condition()` holds, checked after each request the connector records."""
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    def mint_token(
        self,
        *,
        service_url: str | None = None,
        audience: str | None = None,
        issuer: str = ISSUER,
        key_id: str = KEY_ID,
        key: rsa.RSAPrivateKey | None = None,
        expires_in: int = 3600,
    ) -> str:
        """An RS256 token like the Bot Framework channel service sends to bots."""
        now = int(time.time())
        claims = {
            "iss": issuer,
            "aud": audience or self.app_id,
            "serviceurl": service_url or self.service_url,
            "nbf": now - 60,
            "iat": now - 60,
            "exp": now + expires_in,
        }
        return jwt.encode(claims, key or signing_key(), algorithm="RS256", headers={"kid": key_id})

    def bearer(self, **claims: Any) -> dict[str, str]:
        """The Authorization header for a minted token."""
        return {"Authorization": f"Bearer {self.mint_token(**claims)}"}

    async def _metadata(self, _request: Request) -> Response:
        self.metadata_requests += 1
        return JSONResponse(
            {
                "issuer": ISSUER,
                "authorization_endpoint": f"{self.url}/authorize",
                "jwks_uri": f"{self.url}/v1/.well-known/keys",
                "id_token_signing_alg_values_supported": ["RS256"],
                "token_endpoint_auth_methods_supported": ["private_key_jwt"],
            }
        )

    async def _keys(self, _request: Request) -> Response:
        jwk = RSAAlgorithm.to_jwk(signing_key().public_key(), as_dict=True)
        jwk.update({"kid": KEY_ID, "use": "sig", "endorsements": ["msteams"]})
        return JSONResponse({"keys": [jwk]})

    async def _token(self, request: Request) -> Response:
        form = {key: values[0] for key, values in parse_qs((await request.body()).decode()).items()}
        self.token_requests.append(form)
        if form.get("grant_type") != "client_credentials" or (
            form.get("client_id"),
            form.get("client_secret"),
        ) != (self.app_id, self.app_password):
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        token = f"connector-token-{len(self.token_requests)}"
        self._issued.add(token)
        return JSONResponse({"token_type": "Bearer", "expires_in": 3599, "access_token": token})

    async def _content(self, request: Request) -> Response:
        authorization = request.headers.get("authorization")
        self.file_requests.append((request.url.path, authorization))
        if authorization is None or authorization.removeprefix("Bearer ") not in self._issued:
            return JSONResponse({"error": {"code": "Unauthorized"}}, status_code=401)
        served = self.content.get(request.path_params["attachment_id"])
        if served is None:
            return JSONResponse({"error": {"code": "NotFound"}}, status_code=404)
        return file_response(served)

    async def _shared(self, request: Request) -> Response:
        self.file_requests.append((request.url.path, request.headers.get("authorization")))
        if request.query_params.get("tempauth") != TEMPAUTH:
            return Response(b"expired", status_code=401)
        served = self.shared_files.get(request.path_params["name"])
        if served is None:
            return Response(b"not found", status_code=404)
        return file_response(served)

    async def _activities(self, request: Request) -> Response:
        authorization = request.headers.get("authorization")
        if authorization is None or authorization.removeprefix("Bearer ") not in self._issued:
            return JSONResponse({"error": {"code": "Unauthorized"}}, status_code=401)
        post = PostedActivity(
            conversation_id=request.path_params["conversation_id"],
            reply_to_id=request.path_params.get("activity_id"),
            body=await request.json(),
            authorization=authorization,
            received_at=time.monotonic(),
        )
        self.requests.append((post.conversation_id.partition(";")[0], post.received_at))
        try:
            return self._answer(post)
        finally:
            self._changed.set()

    def _answer(self, post: PostedActivity) -> Response:
        if self.failures:
            failure = self.failures.popleft()
            return JSONResponse(
                {"error": {"code": "Scripted", "message": "scripted failure"}},
                status_code=failure.status,
                headers=failure.headers,
            )
        info = post.stream_info
        if info is not None:
            refusal = self._stream_refusal(post, info)
            if refusal is not None:
                return JSONResponse(
                    {"error": {"code": refusal.code, "message": refusal.message}},
                    status_code=refusal.status,
                )
        kept = self.typing if post.body.get("type") == "typing" else self.posted
        kept.append(post)
        if info is not None and not info.get("streamId"):
            stream_id = f"reply-{next(self._ids)}"
            streamed = post.body.get("text", "") if info.get("streamType") == "streaming" else ""
            self.streams[stream_id] = FakeStream(
                stream_id,
                post.conversation_id,
                sequence=1,
                text=streamed,
                updates=1,
                started_at=post.received_at,
            )
            return JSONResponse({"id": stream_id}, status_code=201)
        if info is not None:
            return JSONResponse({}, status_code=202)
        return JSONResponse({"id": f"reply-{next(self._ids)}"}, status_code=201)

    def _stream_refusal(self, post: PostedActivity, info: dict[str, Any]) -> Refusal | None:
        """Why Teams would refuse this stream request, or None (the stream then moves on)."""
        kind, final = info.get("streamType", "streaming"), post.body.get("type") == "message"
        if final != (kind == "final") or kind not in ("informative", "streaming", "final"):
            return self._bad(f"streamType {kind!r} on a {post.body.get('type')} activity")
        stream_id = info.get("streamId")
        if not stream_id:
            if final or info.get("streamSequence") != 1:
                return self._bad("a new stream starts with an update of sequence 1")
            if self.streaming_refused:
                return Refusal(403, STREAM_REFUSED, "Content stream is not allowed")
            return None
        stream = self.streams.get(stream_id)
        if stream is None or stream.conversation_id != post.conversation_id:
            return self._bad(f"unknown stream {stream_id!r}")
        refusal = self._ended(stream)
        if refusal is not None:
            return refusal
        if final:
            if "streamSequence" in info:
                return self._bad("a final message has no streamSequence")
            stream.ended = "final"
            return None
        return self._stream_update(stream, info, post.body.get("text", ""), kind)

    def _ended(self, stream: FakeStream) -> Refusal | None:
        if self.stop_after is not None and stream.updates >= self.stop_after and not stream.ended:
            stream.ended = "stopped"
        if stream.ended == "expired":
            message = "Content stream finished due to exceeded streaming time."
        elif stream.ended:
            message = "Content stream is not allowed on an already completed streamed message"
        else:
            return None
        return Refusal(403, STREAM_REFUSED, message)

    def _stream_update(
        self, stream: FakeStream, info: dict[str, Any], text: str, kind: str
    ) -> Refusal | None:
        sequence = info.get("streamSequence")
        if not isinstance(sequence, int) or sequence <= stream.sequence:
            return self._bad(f"streamSequence {sequence!r} after {stream.sequence}")
        if kind == "streaming" and not text.startswith(stream.text):
            return self._bad("streamed text must extend the text streamed before")
        stream.sequence = sequence
        stream.updates += 1
        if kind == "streaming":
            stream.text = text
        return None

    def _bad(self, reason: str) -> Refusal:
        self.stream_errors.append(reason)
        return Refusal(400, "BadRequest", reason)

    async def __aenter__(self) -> FakeBotFramework:
        conversations = "/{region}/v3/conversations/{conversation_id}/activities"
        app = Starlette(
            routes=[
                Route("/v1/.well-known/openidconfiguration", self._metadata, methods=["GET"]),
                Route("/v1/.well-known/keys", self._keys, methods=["GET"]),
                Route("/botframework.com/oauth2/v2.0/token", self._token, methods=["POST"]),
                Route(conversations, self._activities, methods=["POST"]),
                Route(conversations + "/{activity_id}", self._activities, methods=["POST"]),
                Route(
                    "/{region}/v3/attachments/{attachment_id}/views/{view}",
                    self._content,
                    methods=["GET"],
                ),
                Route("/sharepoint/{name}", self._shared, methods=["GET"]),
            ]
        )
        self._server = _QuietServer(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=self.port,
                log_config=None,
                access_log=False,
                lifespan="off",
            )
        )
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
