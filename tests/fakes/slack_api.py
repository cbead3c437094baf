"""A fake Slack Web API on a loopback port, for the real `slack_sdk` client, and a signer that
sends events to the gateway exactly as Slack signs them.

The API records every call (`calls`: method, parameters and when it arrived) and answers
`auth.test`, `users.info` (from `people`), `chat.postMessage`, `chat.update`, the streaming
methods (`chat.startStream`, `chat.appendStream`, `chat.stopStream`: a stream needs a thread,
and outside a DM the recipient, as Slack says), `assistant.threads.setStatus`, `.setTitle`,
`.setSuggestedPrompts`, `conversations.history` and `.replies` (with message metadata),
`files.info` and `apps.connections.open` (pointing at `socket_url`). It serves the files
`add_file` gives it at `GET /files/{id}/{name}` to the bot token (`bot_token`), and its
sign-in page (200, HTML) to anyone else, as Slack does; `file_requests` records each
download (path and Authorization header). Every message
it holds is in `messages` (by `ts`: its text now, whether it is still streaming). `script`
makes the next `chat.postMessage` calls fail, and `fail_attempts` chosen ones (by their number):
with HTTP 429 and `Retry-After`, a 5xx, or a Slack error code; `fail(method, ...)` does the
same for any method, and `refuse[method] = code` refuses every call of one. `limit_rate`
enforces a per-minute limit per workspace (Slack's tiers) and `limit_per_channel` a
per-second one per conversation, answering 429 past them and counting those in
`rate_limited`.

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
from collections import Counter, deque
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
from tests.fakes.file_server import ServedFile, file_response
from tests.fakes.threaded import ThreadedServer

TEAM = "T0001"
BOT_USER = "UBOT0001"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"  # Slack's documented example secret
BOT_TOKEN = "xoxb-test"
SIGN_IN_PAGE = b"<!DOCTYPE html><html><body>Sign in to Slack</body></html>"


@dataclass
class SlackFailure:
    """One scripted `chat.postMessage` failure."""

    status: int = 429
    error: str = "ratelimited"
    retry_after: str | None = "1"


@dataclass
class SlackMessage:
    """A message the fake holds: where it is, its text now and how it is being written."""

    channel: str
    ts: str
    thread_ts: str | None
    text: str
    created_by: str
    streaming: bool = False
    recipient: tuple[str, str] | None = None
    metadata: dict[str, Any] | None = None


DIRECT = ("D", "U", "W")
# Slack's tier minimums (calls a minute per workspace), for `limit_tiers`.
TIERS = {
    "chat.appendStream": 100,
    "chat.update": 50,
    "chat.startStream": 20,
    "chat.stopStream": 20,
    "assistant.threads.setSuggestedPrompts": 100,
    "assistant.threads.setTitle": 100,
}


@dataclass
class SlackCall:
    """One recorded Web API call."""

    method: str
    params: dict[str, Any]
    at: float = field(default_factory=time.monotonic)
    # Wall clock, comparable with other processes' on this machine (for end-to-end latency).
    received_at: float = field(default_factory=time.time)
    # The client's address: calls over one connection share it.
    peer: tuple[str, int] | None = None


class FakeSlackAPI:
    """The server; use as a context manager. `url` is the client's `base_url`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/"
        self.root = f"http://127.0.0.1:{self.port}"
        self.bot_token = BOT_TOKEN
        self.files: dict[str, ServedFile] = {}
        self.file_objects: dict[str, dict[str, Any]] = {}  # what files.info answers, by id
        self.file_requests: list[tuple[str, str | None]] = []
        self.calls: list[SlackCall] = []
        self.script: deque[SlackFailure] = deque()
        self.people: dict[str, dict[str, Any]] = {}
        self.socket_url = ""
        self.auth_error: str | None = None
        self.fail_attempts: dict[int, SlackFailure] = {}  # nth chat.postMessage (1-based)
        self.uploads: dict[str, dict[str, Any]] = {}  # file id → filename, content, channel
        # Successful chat.postMessage and chat.update calls as (channel, text, received_at,
        # ts, edited), in arrival order: `GET /_posts` reads them without walking `calls`.
        self.post_log: list[tuple[str, str, float, str, bool]] = []
        self.messages: dict[str, SlackMessage] = {}
        self.failures: dict[str, deque[SlackFailure]] = {}
        self.refuse: dict[str, str] = {}
        self.rate_limits: dict[str, int] = {}  # method → calls a minute per workspace
        self.channel_limits: dict[str, int] = {}  # method → calls a second per conversation
        self.rate_limited: Counter[str] = Counter()  # method → 429s answered
        self._windows: dict[tuple[str, ...], deque[float]] = {}
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

    def calls_to(self, *methods: str) -> list[SlackCall]:
        """The calls of these methods, in arrival order."""
        return [call for call in self.calls if call.method in methods]

    def fail(self, method: str, *failures: SlackFailure) -> None:
        """Make the next calls of `method` fail, one failure each."""
        self.failures.setdefault(method, deque()).extend(failures)

    def limit_rate(self, method: str, per_minute: int) -> None:
        """Answer 429 to calls of `method` past `per_minute` in any minute, per workspace."""
        self.rate_limits[method] = per_minute

    def limit_tiers(self) -> None:
        """Enforce Slack's tier minimums (`TIERS`), per workspace."""
        for method, per_minute in TIERS.items():
            self.limit_rate(method, per_minute)

    def limit_per_channel(self, method: str, per_second: int) -> None:
        """Answer 429 to calls of `method` past `per_second` in any second, per conversation."""
        self.channel_limits[method] = per_second

    def add_file(self, file_id: str, served: ServedFile, **fields: Any) -> dict[str, Any]:
        """Hold a file; its file object as an event carries it (`fields` added, or replacing
        the defaults), which `files.info` answers too."""
        url = f"{self.root}/files/{file_id}/{served.name}"
        self.files[file_id] = served
        self.file_objects[file_id] = {
            "id": file_id,
            "name": served.name,
            "mimetype": served.media_type,
            "size": len(served.content),
            "url_private": url,
            "url_private_download": f"{url}?download=1",
            **fields,
        }
        return dict(self.file_objects[file_id])

    def thread(self, channel: str, thread_ts: str | None) -> list[SlackMessage]:
        """The messages the app has in a conversation's thread (None: top level), oldest first."""
        return [
            message
            for message in self.messages.values()
            if message.channel == channel and message.thread_ts == thread_ts
        ]

    async def _call(self, request: Request) -> Response:
        method = request.path_params["method"]
        body = await request.body()
        if request.headers.get("content-type", "").startswith("application/json"):
            params: dict[str, Any] = json.loads(body or b"{}")
        else:
            params = dict(parse_qsl(body.decode()))
        params.update(request.query_params)
        peer = (request.client.host, request.client.port) if request.client else None
        call = SlackCall(method, params, peer=peer)
        self.calls.append(call)
        workspace = request.headers.get("authorization", "")
        limited = self._over_limit(workspace, method, str(params.get("channel") or ""))
        if limited is not None:
            self.rate_limited[method] += 1
            return JSONResponse(
                {"ok": False, "error": "ratelimited"},
                status_code=429,
                headers={"Retry-After": str(limited)},
            )
        failure = self._failure(method)
        if failure is not None:
            return failure
        if method in STREAM_METHODS or method.startswith("assistant.threads."):
            return self._agent_call(call)
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
        if method == "files.info":
            found = self.file_objects.get(str(params.get("file")))
            if found is None:
                return JSONResponse({"ok": False, "error": "file_not_found"})
            return JSONResponse({"ok": True, "file": found})
        if method == "apps.connections.open":
            return JSONResponse({"ok": True, "url": self.socket_url})
        if method in ("chat.postMessage", "chat.update"):
            return self._post(call)
        if method in ("conversations.history", "conversations.replies"):
            return self._history(
                params, thread_ts=params.get("ts") if "replies" in method else None
            )
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
        if call.method == "chat.postMessage":
            with self._lock:
                self._attempts += 1
                attempt = self._attempts
            failure = self.fail_attempts.get(attempt)
            if failure is None and self.script:
                failure = self.script.popleft()
            if failure is not None:
                return _failed(failure)
        params = call.params
        channel = str(params.get("channel") or "")
        if call.method == "chat.update":
            message = self.messages.get(str(params.get("ts")))
            if message is None or message.channel != channel:
                return _refused("message_not_found")
            if message.streaming:
                return _refused("cant_update_message")
            message.text = str(params.get("text") or params.get("markdown_text") or "")
            params["ok"] = True
            self.post_log.append((channel, message.text, call.received_at, message.ts, True))
            return JSONResponse({"ok": True, "channel": channel, "ts": message.ts})
        ts = self._next_ts()
        params["ok"] = True
        params["ts"] = ts
        # Posting to a user id delivers to the app's DM with that user.
        posted_to = f"D{channel[1:]}" if channel.startswith(("U", "W")) else channel
        thread_ts = str(params.get("thread_ts") or "") or None
        text = str(params.get("text") or params.get("markdown_text") or "")
        metadata = params.get("metadata")
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        self.messages[ts] = SlackMessage(
            posted_to, ts, thread_ts, text, call.method, metadata=metadata
        )
        self.post_log.append((channel, str(params.get("text")), call.received_at, ts, False))
        return JSONResponse({"ok": True, "channel": posted_to, "ts": ts})

    def _history(self, params: dict[str, Any], *, thread_ts: Any) -> Response:
        """`conversations.history` (top level, newest first) or `.replies` (one thread, oldest
        first), after `oldest`, with the metadata when `include_all_metadata` is set."""
        oldest = float(params.get("oldest") or 0)
        with_metadata = str(params.get("include_all_metadata")).lower() in ("true", "1")
        found = [
            message
            for message in list(self.messages.values())
            if message.channel == params.get("channel")
            and message.thread_ts == (str(thread_ts) if thread_ts else None)
            and float(message.ts) > oldest
        ]
        found.sort(key=lambda message: float(message.ts), reverse=thread_ts is None)
        listed = []
        for message in found[: int(params.get("limit") or 100)]:
            item: dict[str, Any] = {"type": "message", "ts": message.ts, "text": message.text}
            if with_metadata and message.metadata:
                item["metadata"] = message.metadata
            listed.append(item)
        return JSONResponse({"ok": True, "messages": listed, "has_more": False})

    def _agent_call(self, call: SlackCall) -> Response:
        """The streaming methods and `assistant.threads.*`."""
        params = call.params
        if call.method == "chat.startStream":
            return self._start_stream(params)
        if call.method in ("chat.appendStream", "chat.stopStream"):
            message = self.messages.get(str(params.get("ts")))
            if message is None or message.channel != params.get("channel"):
                return _refused("message_not_found")
            if not message.streaming:
                return _refused("message_not_in_streaming_state")
            message.text += _markdown_of(params)
            message.streaming = call.method == "chat.appendStream"
            params["ok"] = True
            return JSONResponse({"ok": True, "channel": message.channel, "ts": message.ts})
        if call.method != "assistant.threads.setSuggestedPrompts" and not params.get("thread_ts"):
            return _refused("invalid_arguments")
        params["ok"] = True
        return JSONResponse({"ok": True})

    def _start_stream(self, params: dict[str, Any]) -> Response:
        channel, thread_ts = str(params.get("channel") or ""), str(params.get("thread_ts") or "")
        if not thread_ts:
            return _refused("invalid_thread_ts")
        team, user = params.get("recipient_team_id"), params.get("recipient_user_id")
        if not channel.startswith(DIRECT) and not team:
            return _refused("missing_recipient_team_id")
        if not channel.startswith(DIRECT) and not user:
            return _refused("missing_recipient_user_id")
        ts = self._next_ts()
        params["ok"] = True
        params["ts"] = ts
        self.messages[ts] = SlackMessage(
            channel,
            ts,
            thread_ts,
            _markdown_of(params),
            "chat.startStream",
            streaming=True,
            recipient=(str(team or ""), str(user or "")),
        )
        return JSONResponse({"ok": True, "channel": channel, "ts": ts})

    def _failure(self, method: str) -> Response | None:
        """A scripted failure (`fail`) or a standing refusal (`refuse`) of this call."""
        queued = self.failures.get(method)
        if queued:
            return _failed(queued.popleft())
        if method in self.refuse:
            return _refused(self.refuse[method])
        return None

    def _over_limit(self, workspace: str, method: str, channel: str) -> int | None:
        """Seconds until a call of `method` is allowed again, or None when it is allowed."""
        limits = []
        if method in self.rate_limits:
            limits.append(((workspace, method), self.rate_limits[method], 60.0))
        if method in self.channel_limits and channel:
            limits.append(((workspace, method, channel), self.channel_limits[method], 1.0))
        now = time.monotonic()
        with self._lock:
            for key, allowed, period in limits:
                window = self._windows.setdefault(key, deque())
                while window and window[0] <= now - period:
                    window.popleft()
                if len(window) >= allowed:
                    return max(int(window[0] + period - now) + 1, 1)
            for key, _allowed, _period in limits:
                self._windows[key].append(now)
        return None

    def _next_ts(self) -> str:
        with self._lock:
            self._ts += 1
            return f"1800000000.{self._ts:06d}"

    async def _upload(self, request: Request) -> Response:
        self.uploads[request.path_params["file_id"]]["content"] = (await request.body()).decode()
        return Response(f"OK - {len(self.uploads)}")

    async def _file(self, request: Request) -> Response:
        authorization = request.headers.get("authorization")
        self.file_requests.append((request.url.path, authorization))
        served = self.files.get(request.path_params["file_id"])
        if served is None:
            return Response(b"not found", status_code=404)
        if authorization != f"Bearer {self.bot_token}":
            return Response(SIGN_IN_PAGE, media_type="text/html")
        return file_response(served)

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
                {"channel": channel, "text": text, "at": at, "ts": ts, "edited": edited}
                for channel, text, at, ts, edited in self.post_log[after:]
            ]
        )

    def app(self) -> Starlette:
        """The ASGI app: the Web API under `/api/`, the files under `/files/`, `/_posted`
        (channels posted to) and `/_posts` (every post: channel, text and when it arrived)."""
        return Starlette(
            routes=[
                Route("/api/{method}", self._call, methods=["GET", "POST"]),
                Route("/_posted", self._posted, methods=["GET"]),
                Route("/_posts", self._posts, methods=["GET"]),
                Route("/upload/{file_id}", self._upload, methods=["POST"]),
                Route("/files/{file_id}/{name}", self._file, methods=["GET"]),
            ]
        )

    def __enter__(self) -> FakeSlackAPI:
        self._server = ThreadedServer(self.app(), self.port, "fake Slack API")
        self._server.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._server is not None:
            self._server.stop()


STREAM_METHODS = frozenset({"chat.startStream", "chat.appendStream", "chat.stopStream"})


def _markdown_of(params: dict[str, Any]) -> str:
    """The Markdown a streaming call carries (`markdown_text`, or markdown_text chunks)."""
    text = str(params.get("markdown_text") or "")
    chunks = params.get("chunks")
    if isinstance(chunks, str):
        chunks = json.loads(chunks)
    for chunk in chunks or ():
        if isinstance(chunk, dict) and chunk.get("type") == "markdown_text":
            text += str(chunk.get("text") or "")
    return text


def _failed(failure: SlackFailure) -> Response:
    headers = {"Retry-After": failure.retry_after} if failure.retry_after else {}
    return JSONResponse(
        {"ok": False, "error": failure.error}, status_code=failure.status, headers=headers
    )


def _refused(error: str) -> Response:
    return JSONResponse({"ok": False, "error": error})


def assistant_thread_started(
    *, channel: str = "D0001", thread_ts: str, user: str = "U0001", team: str = TEAM
) -> dict[str, Any]:
    """An `assistant_thread_started` event (the user opened a new assistant thread)."""
    return {
        "type": "assistant_thread_started",
        "assistant_thread": {
            "user_id": user,
            "context": {"channel_id": "C0001", "team_id": team, "enterprise_id": None},
            "channel_id": channel,
            "thread_ts": thread_ts,
        },
        "event_ts": thread_ts,
    }


def app_home_opened(*, tab: str = "messages", user: str = "U0001") -> dict[str, Any]:
    """An `app_home_opened` event (the user opened one of the app's tabs)."""
    return {
        "type": "app_home_opened",
        "user": user,
        "channel": "D0001",
        "tab": tab,
        "event_ts": f"{time.time():.6f}",
    }


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
