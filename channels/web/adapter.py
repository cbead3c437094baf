"""The web channel: a small JSON API and a chat page.

`POST /web/v1/messages` `{"user", "text", "thread_id"?, "message_id"?}` → 202 `{"message_id"}`
once the message is committed; `GET /web/v1/messages?user=U&after=CURSOR` → the replies to that
user after the cursor, oldest first. Callers authenticate with `Authorization: Bearer <token>`
(tokens map to users in the config); with `dev_open` (development, loopback only) the `user`
field is trusted instead. `GET /web/` serves the chat page that uses the API.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from channels.base import (
    ChannelMessage,
    ChannelType,
    Conversation,
    DeliveryReceipt,
    InboxPort,
    OutboundMessage,
    parse_json,
    read_body,
)
from channels.plugin import ExportReader, ReplyFeed
from errors import ChannelAuthError, ChannelPayloadError, RejectedRequestError, StorageError

log = structlog.stdlib.get_logger(__name__)

MAX_BODY_BYTES = 1_048_576
ID_PATTERN = re.compile(r"[A-Za-z0-9._:@+-]{1,200}")
# A web user id never contains ':' (the separator of namespaced message ids).
USER_PATTERN = re.compile(r"[A-Za-z0-9._@+-]{1,200}")


@dataclass(frozen=True, slots=True)
class WebSettings:
    """The web channel's configuration."""

    dev_open: bool
    tokens: Mapping[str, str]  # token → user id
    max_text_chars: int


def namespaced_id(user_id: str, message_id: str) -> str:
    """Web message ids are chosen by clients: scope them to the user so users never collide."""
    return f"{user_id}:{message_id}"


def parse_web_message(
    body: object, *, user_id: str, now: datetime, max_text_chars: int
) -> ChannelMessage:
    """The `ChannelMessage` for a POST body from `user_id`; raises `ChannelPayloadError`."""
    if not isinstance(body, dict):
        raise ChannelPayloadError("the body must be a JSON object")
    if not USER_PATTERN.fullmatch(user_id):
        raise ChannelPayloadError("a web user id is letters, digits and . _ @ + - only")
    unknown = sorted(set(body) - {"user", "text", "thread_id", "message_id"})
    if unknown:
        raise ChannelPayloadError(f"unknown field(s): {', '.join(unknown)}")
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ChannelPayloadError("'text' must be a non-empty string")
    if len(text) > max_text_chars:
        raise RejectedRequestError(413, f"'text' is longer than {max_text_chars} characters")
    thread_id = _optional_id(body, "thread_id")
    message_id = _optional_id(body, "message_id") or uuid.uuid4().hex
    return ChannelMessage(
        channel_type=ChannelType.WEB,
        channel_id=user_id,
        message_id=namespaced_id(user_id, message_id),
        user_identifier=user_id,
        content=text,
        timestamp=now,
        thread_id=thread_id or "",
        reply_context={"client_message_id": message_id},
        conversation=Conversation.DIRECT,  # the user's own feed
        raw=dict(body),
    )


def _read_page() -> str:
    return resources.files("channels.web").joinpath("page.html").read_text(encoding="utf-8")


def _optional_id(body: Mapping[str, object], field: str) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise ChannelPayloadError(
            f"'{field}' must be 1-200 characters of letters, digits and . _ : @ + -"
        )
    return value


class WebChannel:
    """The web channel's HTTP routes and its (trivial) outbound half."""

    channel_type = ChannelType.WEB

    def __init__(
        self,
        settings: WebSettings,
        inbox: InboxPort,
        feed: ReplyFeed,
        exports: ExportReader,
        *,
        clock: Callable[[], datetime],
        on_rejected: Callable[[int, str], None],
    ) -> None:
        self.settings = settings
        self.inbox = inbox
        self.feed = feed
        self.exports = exports
        self.clock = clock
        self.on_rejected = on_rejected
        self._page: str | None = None

    async def start(self) -> None:
        """Read the chat page (the channel is otherwise its HTTP routes)."""
        self._page = await asyncio.to_thread(_read_page)

    async def stop(self) -> None:
        """Nothing to close."""

    def reconfigure(self, settings: WebSettings) -> None:
        """Apply reloaded tokens, `dev_open` and the text limit to the next request."""
        self.settings = settings

    def routes(self) -> Sequence[Route]:
        """The channel's routes, mounted by the gateway's app."""
        return [
            Route("/web/v1/messages", self.post_message, methods=["POST"]),
            Route("/web/v1/messages", self.get_messages, methods=["GET"]),
            Route("/web/v1/exports/{token}", self.get_export, methods=["GET"]),
            Route("/web/", self.page, methods=["GET"]),
        ]

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Web replies are read by polling the feed: being committed is being delivered. (The
        gateway stores web replies as delivered already; this covers any left pending.)"""
        return DeliveryReceipt(platform_message_id=message.message_id)

    async def post_message(self, request: Request) -> Response:
        """Accept one message; 202 only after the inbox committed it."""
        try:
            body = await _json_object(request)
            user_id = self._authenticate(request, body.get("user"))
            message = parse_web_message(
                body, user_id=user_id, now=self.clock(), max_text_chars=self.settings.max_text_chars
            )
            result = await self.inbox.accept(message)
        except (RejectedRequestError, ChannelPayloadError, ChannelAuthError) as exc:
            return self._reject(request, exc)
        except StorageError as exc:
            return self._reject(
                request, RejectedRequestError(503, f"the message could not be stored: {exc}")
            )
        client_id = str(message.reply_context["client_message_id"])
        return JSONResponse(
            {"message_id": client_id, "duplicate": not result.accepted}, status_code=202
        )

    async def get_messages(self, request: Request) -> Response:
        """The replies to the caller after the cursor."""
        try:
            user_id = self._authenticate(request, request.query_params.get("user"))
            after = _cursor(request.query_params.get("after"))
            limit = _limit(request.query_params.get("limit"))
        except (RejectedRequestError, ChannelPayloadError, ChannelAuthError) as exc:
            return self._reject(request, exc)
        messages, cursor = await self.feed.replies(user_id, after=after, limit=limit)
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
        """The chat page."""
        if self._page is None:  # read once, off the event loop
            self._page = await asyncio.to_thread(_read_page)
        return HTMLResponse(self._page.replace("__DEV_OPEN__", json.dumps(self.settings.dev_open)))

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
        return JSONResponse({"error": reason}, status_code=status)


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await read_body(request, MAX_BODY_BYTES)
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise ChannelPayloadError("the body must be a JSON object")
    return body


def _cursor(value: str | None) -> int:
    if value in (None, ""):
        return 0
    if not value.isdigit():
        raise ChannelPayloadError("'after' must be a cursor returned by this API")
    return int(value)


def _limit(value: str | None) -> int:
    if value in (None, ""):
        return 100
    if not value.isdigit() or not 1 <= int(value) <= 500:
        raise ChannelPayloadError("'limit' must be a number from 1 to 500")
    return int(value)
