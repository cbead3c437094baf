"""The web channel: a small JSON API and a chat page.

`POST /web/v1/messages` `{"user", "text", "thread_id"?, "message_id"?}` → 202 `{"message_id"}`
once the message is committed (the same fields in a `multipart/form-data` form bring files in
`files` parts: `channels.web.uploads`); `GET /web/v1/messages?user=U&after=CURSOR` → the
replies to that user after the cursor, oldest first; the same with `Accept:
text/event-stream` streams them, with the answer's status and text while it is written
(`channels.web.events`); `GET /web/v1/history?user=U&limit=N` → the user's own messages and
the replies, for the page after a reload. Callers authenticate with `Authorization: Bearer
<token>` (tokens map to users in the config); with `dev_open` (development, loopback only) the
`user` field is trusted instead. `GET /web/` serves the chat page that uses the API.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from channels.base import (
    ChannelMessage,
    ChannelType,
    DeliveryReceipt,
    InboxPort,
    OutboundMessage,
    RefusalResponse,
    parse_json,
    read_body,
)
from channels.files import FileLimits, FileStash
from channels.live import ReplyTarget
from channels.plugin import NO_HISTORY, ConversationHistory, ExportReader, ReplyFeed
from channels.web.events import EventStream, StreamTiming
from channels.web.live import LiveHub, TooManyStreamsError, WebLiveReply
from channels.web.parse import (
    ID_PATTERN,
    USER_PATTERN,
    namespaced_id,
    parse_cursor,
    parse_limit,
    parse_web_message,
)
from channels.web.uploads import discard, is_upload, upload_message
from errors import ChannelAuthError, ChannelPayloadError, RejectedRequestError, StorageError

# The parsing names stay importable from here, where they lived first.
__all__ = [
    "ID_PATTERN",
    "MAX_BODY_BYTES",
    "USER_PATTERN",
    "WebChannel",
    "WebSettings",
    "namespaced_id",
    "parse_web_message",
]

log = structlog.stdlib.get_logger(__name__)

MAX_BODY_BYTES = 1_048_576


@dataclass(frozen=True, slots=True)
class WebSettings:
    """The web channel's configuration."""

    dev_open: bool
    tokens: Mapping[str, str]  # token → user id
    max_text_chars: int
    # Show the answer's status and text on open event streams while it is written.
    streaming: bool = True


def _read_page() -> str:
    return resources.files("channels.web").joinpath("page.html").read_text(encoding="utf-8")


class WebChannel:
    """The web channel's HTTP routes and its (trivial) outbound half."""

    channel_type = ChannelType.WEB
    # Updates are in-process hand-overs to open streams: nothing to pace but the browser.
    live_interval = 0.1

    def __init__(
        self,
        settings: WebSettings,
        inbox: InboxPort,
        feed: ReplyFeed,
        exports: ExportReader,
        *,
        clock: Callable[[], datetime],
        on_rejected: Callable[[int, str], None],
        history: ConversationHistory = NO_HISTORY,
        hub: LiveHub | None = None,
        timing: StreamTiming | None = None,
        files: FileStash | None = None,
        file_limits: Callable[[], FileLimits] = FileLimits,
    ) -> None:
        self.settings = settings
        self.inbox = inbox
        self.feed = feed
        self.exports = exports
        self.clock = clock
        self.on_rejected = on_rejected
        self.history = history
        self.hub = hub or LiveHub()
        self.timing = timing or StreamTiming()
        # Where uploaded files wait for the turn (None: uploads are refused), and the files
        # limits in force (they change on reload).
        self.files = files
        self.file_limits = file_limits
        self._page: str | None = None

    async def open(self) -> None:
        """Nothing to open: a reply is a row of the feed and a note to the open streams."""

    async def start(self) -> None:
        """Read the chat page (the channel is otherwise its HTTP routes)."""
        self._page = await asyncio.to_thread(_read_page)

    async def stop(self) -> None:
        """End the open event streams (their clients reconnect to another process)."""
        self.hub.close()

    def reconfigure(self, settings: WebSettings) -> None:
        """Apply reloaded tokens, `dev_open`, the text limit and `streaming` to the next
        request or turn."""
        self.settings = settings

    def live_reply(
        self, target: ReplyTarget, *, resume: Mapping[str, Any] | None = None
    ) -> WebLiveReply | None:
        """The turn's status and text for the user's open streams (`channels.live`); None
        with `streaming` off. A resumed turn needs nothing special: there is no platform
        message, and the feed holds the one reply."""
        if not self.settings.streaming:
            return None
        # The feed's key is the web user id (the message's channel id), not the gateway's.
        user = target.channel_id
        return WebLiveReply(self.hub, user, target.in_reply_to.removeprefix(f"{user}:"))

    def routes(self) -> Sequence[Route]:
        """The channel's routes, mounted by the gateway's app."""
        return [
            Route("/web/v1/messages", self.post_message, methods=["POST"]),
            Route("/web/v1/messages", self.get_messages, methods=["GET"]),
            Route("/web/v1/history", self.get_history, methods=["GET"]),
            Route("/web/v1/exports/{token}", self.get_export, methods=["GET"]),
            Route("/web/", self.page, methods=["GET"]),
        ]

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Web replies are read by polling the feed: being committed is being delivered. (The
        gateway stores web replies as delivered already; this covers any left pending.)"""
        return DeliveryReceipt(platform_message_id=message.message_id)

    async def post_message(self, request: Request) -> Response:
        """Accept one message, a JSON body or a form with files; 202 only after the inbox
        committed it (and the files' bytes were stashed)."""
        try:
            if is_upload(request):
                if request.headers.get("authorization") or not self.settings.dev_open:
                    self._authenticate(request, None)  # before reading what a caller sends
                message = await upload_message(
                    request,
                    self.files,
                    self.file_limits(),
                    authenticate=functools.partial(self._authenticate, request),
                    now=self.clock(),
                    max_text_chars=self.settings.max_text_chars,
                )
            else:
                body = await _json_object(request)
                message = parse_web_message(
                    body,
                    user_id=self._authenticate(request, body.get("user")),
                    now=self.clock(),
                    max_text_chars=self.settings.max_text_chars,
                )
        except (RejectedRequestError, ChannelPayloadError, ChannelAuthError) as exc:
            return self._reject(request, exc)
        try:
            result = await self.inbox.accept(message)
        except StorageError as exc:
            await self._discard(message)
            return self._reject(
                request, RejectedRequestError(503, f"the message could not be stored: {exc}")
            )
        if not result.accepted:
            await self._discard(message)  # the first copy's files are stashed already
        client_id = str(message.reply_context["client_message_id"])
        return JSONResponse(
            {"message_id": client_id, "duplicate": not result.accepted}, status_code=202
        )

    async def _discard(self, message: ChannelMessage) -> None:
        if self.files is not None:
            await discard(message.attachments, self.files)

    async def get_messages(self, request: Request) -> Response:
        """The replies to the caller after the cursor: a JSON page, or an event stream."""
        if "text/event-stream" in request.headers.get("accept", ""):
            return await self.stream_messages(request)
        try:
            user_id = self._authenticate(request, request.query_params.get("user"))
            after = parse_cursor(request.query_params.get("after"))
            limit = parse_limit(request.query_params.get("limit"))
        except (RejectedRequestError, ChannelPayloadError, ChannelAuthError) as exc:
            return self._reject(request, exc)
        messages, cursor = await self.feed.replies(user_id, after=after, limit=limit)
        return JSONResponse({"messages": messages, "cursor": str(cursor)})

    async def stream_messages(self, request: Request) -> Response:
        """The replies after the cursor (or `Last-Event-ID`) and the live answers, as
        server-sent events; 429 over the per-user limit of open streams."""
        try:
            user_id = self._authenticate(request, request.query_params.get("user"))
            resumed = request.headers.get("last-event-id")
            after = parse_cursor(resumed if resumed else request.query_params.get("after"))
            stream = EventStream(self.hub, self.feed, user_id, after=after, timing=self.timing)
            subscription = stream.open()
        except TooManyStreamsError as exc:
            return self._reject(request, RejectedRequestError(429, str(exc)))
        except (RejectedRequestError, ChannelPayloadError, ChannelAuthError) as exc:
            return self._reject(request, exc)
        return StreamingResponse(
            stream.body(subscription),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def get_history(self, request: Request) -> Response:
        """The caller's conversation for the page after a reload: their own messages and the
        replies, oldest first, and the feed cursor to continue from."""
        try:
            user_id = self._authenticate(request, request.query_params.get("user"))
            limit = parse_limit(request.query_params.get("limit"))
        except (RejectedRequestError, ChannelPayloadError, ChannelAuthError) as exc:
            return self._reject(request, exc)
        messages, cursor = await self.history.history(user_id, limit=limit)
        return JSONResponse({"messages": messages, "cursor": str(cursor)})

    async def get_export(self, request: Request) -> Response:
        """An `/export` download: the token in the link is the authorisation (24 hours)."""
        token = request.path_params["token"]
        data = await self.exports.export(token) if len(token) <= 100 else None
        if data is None:
            return self._reject(
                request, RejectedRequestError(404, "unknown or expired export link")
            )
        return JSONResponse(
            data,
            headers={
                "Content-Disposition": f'attachment; filename="session-{data["session_id"]}.json"',
                "Cache-Control": "no-store",
            },
        )

    async def page(self, _request: Request) -> Response:
        """The chat page, told whether files are taken and within which limits."""
        if self._page is None:  # read once, off the event loop
            self._page = await asyncio.to_thread(_read_page)
        limits = self.file_limits()
        uploads = {
            "enabled": self.files is not None and limits.enabled,
            "max_files": limits.max_files,
            "max_file_bytes": limits.max_file_bytes,
            "max_message_bytes": limits.max_message_bytes,
        }
        page = self._page.replace("__DEV_OPEN__", json.dumps(self.settings.dev_open))
        return HTMLResponse(page.replace("__UPLOADS__", json.dumps(uploads)))

    def _authenticate(self, request: Request, claimed_user: object) -> str:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if header and (scheme.lower() != "bearer" or not token.strip()):
            raise RejectedRequestError(401, "Authorization must be 'Bearer <token>'")
        if token.strip():
            user_id = self._user_of_token(token.strip())
            if user_id is None:
                raise RejectedRequestError(401, "unknown token")
            if claimed_user not in (None, "", user_id):
                raise RejectedRequestError(403, "the token belongs to another user")
            return user_id
        if not self.settings.dev_open:
            raise RejectedRequestError(401, "missing bearer token")
        if not isinstance(claimed_user, str) or not USER_PATTERN.fullmatch(claimed_user):
            raise ChannelPayloadError("'user' must name the user (letters, digits, . _ @ + -)")
        return claimed_user

    def _user_of_token(self, token: str) -> str | None:
        found = None
        # Compare against every token, always, in constant time per comparison.
        for candidate, user_id in self.settings.tokens.items():
            if hmac.compare_digest(candidate.encode(), token.encode()):
                found = user_id
        return found

    def _reject(self, request: Request, exc: Exception) -> Response:
        status = exc.status if isinstance(exc, RejectedRequestError) else 400
        reason = exc.reason if isinstance(exc, RejectedRequestError) else str(exc)
        route = request.scope.get("route")
        log.warning(
            "web.rejected",
            status=status,
            reason=reason,
            method=request.method,
            # The route's template, not the path: an export link's path holds its token.
            path=getattr(route, "path", "?"),
        )
        self.on_rejected(status, reason)
        return RefusalResponse(status, reason)


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await read_body(request, MAX_BODY_BYTES)
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise ChannelPayloadError("the body must be a JSON object")
    return body
