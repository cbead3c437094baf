"""A fake Slack Web API on a loopback port, for the real `slack_sdk` client, and a signer that
sends events to the gateway exactly as Slack signs them.

The API records every call (`calls`: method and parameters) and answers `auth.test`,
`users.info` (from `people`), `chat.postMessage`, `chat.update` and `apps.connections.open`
(pointing at `socket_url`). `script` makes the next `chat.postMessage` calls fail, and
`fail_attempts` chosen ones (by their number): with HTTP 429 and `Retry-After`, a 5xx, or a
Slack error code.

Run as a process of its own (`python -m tests.fakes.slack_api --port N`, for benchmarks), it
reports what was posted over HTTP: `GET /_posted` (the channels) and `GET /_posts?after=N`
(channel, text and the wall-clock time each post arrived, from the N-th post on).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.e2e.harness import free_port
from tests.fakes.threaded import ThreadedServer

TEAM = "T0001"
BOT_USER = "UBOT0001"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"  # Slack's documented example secret


@dataclass
class SlackFailure:
    """One scripted `chat.postMessage` failure."""

    status: int = 429
    error: str = "ratelimited"
    retry_after: str | None = "1"


@dataclass
class SlackCall:
    """One recorded Web API call."""

    method: str
    params: dict[str, Any]
    at: float = field(default_factory=time.monotonic)
    # Wall clock, comparable with other processes' on this machine (for end-to-end latency).
    received_at: float = field(default_factory=time.time)


class FakeSlackAPI:
    """The server; use as a context manager. `url` is the client's `base_url`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/"
        self.calls: list[SlackCall] = []
        self.script: deque[SlackFailure] = deque()
        self.people: dict[str, dict[str, Any]] = {}
        self.socket_url = ""
        self.auth_error: str | None = None
        self.fail_attempts: dict[int, SlackFailure] = {}  # nth chat.postMessage (1-based)
        self.uploads: dict[str, dict[str, Any]] = {}  # file id → filename, content, channel
        # Successful chat.postMessage calls as (channel, text, received_at), in arrival order:
        # `GET /_posts` reads them without walking `calls`.
        self.post_log: list[tuple[str, str, float]] = []
        self._attempts = 0
        self._ts = 0
        self._lock = threading.Lock()
        self._server: ThreadedServer | None = None

    def posts(self, channel: str | None = None) -> list[dict[str, Any]]:
        """The parameters of every successful `chat.postMessage`, optionally in one channel."""
        return [
            call.params
            for call in self.calls
            if call.method == "chat.postMessage"
            and call.params.get("ok")
            and (channel is None or call.params.get("channel") == channel)
        ]

    async def _call(self, request: Request) -> Response:
        method = request.path_params["method"]
        body = await request.body()
        if request.headers.get("content-type", "").startswith("application/json"):
            params: dict[str, Any] = json.loads(body or b"{}")
        else:
            params = dict(parse_qsl(body.decode()))
        params.update(request.query_params)
        call = SlackCall(method, params)
        self.calls.append(call)
        if method == "auth.test" and self.auth_error:
            return JSONResponse({"ok": False, "error": self.auth_error})
        if method == "auth.test":
            return JSONResponse(
                {"ok": True, "user_id": BOT_USER, "bot_id": "B0001", "team_id": TEAM}
            )
        if method == "users.info":
            person = self.people.get(str(params.get("user")))
            if person is None:
                return JSONResponse({"ok": False, "error": "user_not_found"})
            return JSONResponse({"ok": True, "user": person})
        if method == "apps.connections.open":
            return JSONResponse({"ok": True, "url": self.socket_url})
        if method in ("chat.postMessage", "chat.update"):
            return self._post(call)
        if method == "files.getUploadURLExternal":
            file_id = f"F{len(self.uploads) + 1:05d}"
            self.uploads[file_id] = {"filename": params.get("filename"), "content": None}
            url = f"http://127.0.0.1:{self.port}/upload/{file_id}"
            return JSONResponse({"ok": True, "upload_url": url, "file_id": file_id})
        if method == "files.completeUploadExternal":
            files = json.loads(str(params.get("files") or "[]"))
            for item in files:
                self.uploads[item["id"]]["channel"] = params.get("channel_id")
                self.uploads[item["id"]]["thread_ts"] = params.get("thread_ts")
            return JSONResponse({"ok": True, "files": files})
        return JSONResponse({"ok": False, "error": "unknown_method"}, status_code=404)

    def _post(self, call: SlackCall) -> Response:
        with self._lock:
            self._attempts += 1
            attempt = self._attempts
        failure = self.fail_attempts.get(attempt)
        if failure is None and self.script:
            failure = self.script.popleft()
        if failure is not None:
            headers = {"Retry-After": failure.retry_after} if failure.retry_after else {}
            return JSONResponse(
                {"ok": False, "error": failure.error}, status_code=failure.status, headers=headers
            )
        with self._lock:
            self._ts += 1
            ts = f"1800000000.{self._ts:06d}"
        call.params["ok"] = True
        call.params["ts"] = ts
        if call.method == "chat.postMessage":
            channel, text = call.params.get("channel"), call.params.get("text")
            self.post_log.append((str(channel), str(text), call.received_at))
        return JSONResponse({"ok": True, "channel": call.params.get("channel"), "ts": ts})

    async def _upload(self, request: Request) -> Response:
        self.uploads[request.path_params["file_id"]]["content"] = (await request.body()).decode()
        return Response(f"OK - {len(self.uploads)}")

    async def _posted(self, _request: Request) -> Response:
        # For a benchmark running this server as a process of its own.
        return JSONResponse([post["channel"] for post in self.posts()])

    async def _posts(self, request: Request) -> Response:
        # For a benchmark running this server as a process of its own: it reads the posts
        # as they come, from the first it has not seen yet (`after`).
        try:
            after = max(int(request.query_params.get("after", "0")), 0)
        except ValueError:
            return JSONResponse({"error": "after must be a number"}, status_code=400)
        return JSONResponse(
            [
                {"channel": channel, "text": text, "at": at}
                for channel, text, at in self.post_log[after:]
            ]
        )

    def app(self) -> Starlette:
        """The ASGI app: the Web API under `/api/`, `/_posted` (channels posted to) and
        `/_posts` (every post: channel, text and when it arrived)."""
        return Starlette(
            routes=[
                Route("/api/{method}", self._call, methods=["GET", "POST"]),
                Route("/_posted", self._posted, methods=["GET"]),
                Route("/_posts", self._posts, methods=["GET"]),
                Route("/upload/{file_id}", self._upload, methods=["POST"]),
            ]
        )

    def __enter__(self) -> FakeSlackAPI:
        self._server = ThreadedServer(self.app(), self.port, "fake Slack API")
        self._server.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._server is not None:
            self._server.stop()


def sign(
    body: bytes, *, secret: str = SIGNING_SECRET, timestamp: int | None = None
) -> dict[str, str]:
    """The headers Slack sends with `body`: HMAC-SHA256 over `v0:{timestamp}:{body}`."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), f"v0:{stamp}:".encode() + body, hashlib.sha256)
    return {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": f"v0={digest.hexdigest()}",
    }


async def send_event(
    client: httpx.AsyncClient,
    envelope: dict[str, Any],
    *,
    retry: int = 0,
    secret: str = SIGNING_SECRET,
) -> httpx.Response:
    """POST a signed Events API envelope to `/slack/events` (as a retry when `retry` > 0)."""
    body = json.dumps(envelope).encode()
    headers = {"Content-Type": "application/json", **sign(body, secret=secret)}
    if retry:
        headers["X-Slack-Retry-Num"] = str(retry)
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    return await client.post("/slack/events", content=body, headers=headers)


async def send_shortcut(
    client: httpx.AsyncClient, payload: dict[str, Any], *, secret: str = SIGNING_SECRET
) -> httpx.Response:
    """POST a signed interactivity payload (form-encoded `payload=`) to `/slack/events`."""
    body = httpx.QueryParams({"payload": json.dumps(payload)}).__str__().encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded", **sign(body, secret=secret)}
    return await client.post("/slack/events", content=body, headers=headers)


def event_envelope(event: dict[str, Any], event_id: str, *, team: str = TEAM) -> dict[str, Any]:
    """An `event_callback` envelope shaped like Slack's documented example."""
    return {
        "token": "legacy-verification-token",
        "team_id": team,
        "api_app_id": "A0001",
        "event": event,
        "type": "event_callback",
        "event_id": event_id,
        "event_time": int(time.time()),
        "authorizations": [
            {"enterprise_id": None, "team_id": team, "user_id": BOT_USER, "is_bot": True}
        ],
        "is_ext_shared_channel": False,
    }


def direct_message(text: str, *, user: str = "U0001", ts: str, **fields: Any) -> dict[str, Any]:
    """A `message.im` event."""
    return {
        "type": "message",
        "channel": "D0001",
        "channel_type": "im",
        "user": user,
        "text": text,
        "ts": ts,
        "event_ts": ts,
        **fields,
    }


def main() -> None:
    """Serve the fake on `--port` until killed (`python -m tests.fakes.slack_api`)."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description="A fake Slack Web API on loopback.")
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    api = FakeSlackAPI()
    uvicorn.run(api.app(), host="127.0.0.1", port=port, log_config=None, access_log=False)


if __name__ == "__main__":
    main()
