"""The Slack channel: Events API (HTTP) or Socket Mode in, `chat.postMessage` out.

Built on slack-bolt's `AsyncApp`: bolt verifies request signatures (in HTTP mode; the route
checks them first too, to answer 401 with a reason) and dispatches events and the "Send to
assistant" shortcut to listeners that parse them (`slack_parse.py`) and commit them to the
inbox before the response goes out. Replies are converted from Markdown to mrkdwn and split at
Slack's message limit (`slack_format.py`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import aiohttp
import structlog
from slack_bolt import BoltResponse
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.adapter.starlette.async_handler import to_starlette_response
from slack_bolt.async_app import AsyncApp, AsyncBoltRequest
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.request.internals import parse_body
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from channels.base import (
    ChannelMessage,
    ChannelType,
    DeliveryReceipt,
    InboxPort,
    OutboundMessage,
)
from channels.slack.format import markdown_to_mrkdwn, split_for_slack
from channels.slack.parse import SHORTCUT_CALLBACK_ID, parse_slack_event, parse_slack_shortcut
from errors import ChannelAuthError, ChannelPayloadError, DeliveryError, StorageError

log = structlog.stdlib.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SlackSettings:
    """The Slack channel's configuration."""

    bot_token: str
    signing_secret: str = ""
    mode: Literal["http", "socket"] = "http"
    app_token: str = ""
    allowed_team_ids: frozenset[str] = frozenset()
    api_base_url: str = "https://slack.com/api/"
    max_text_chars: int = 16_000


class ThreadDirectory(Protocol):
    """Tells whether a channel thread is one the assistant takes part in (the gateway
    implements it over the sessions' channels)."""

    async def has_thread(self, channel_id: str, thread_id: str) -> bool:
        """True when a session owns this Slack thread."""
        ...


# Slack's answers that trying again cannot fix.
PERMANENT_ERRORS = frozenset(
    {
        "account_inactive",
        "channel_not_found",
        "invalid_auth",
        "is_archived",
        "missing_scope",
        "msg_too_long",
        "no_permission",
        "no_text",
        "not_authed",
        "not_in_channel",
        "restricted_action",
        "token_revoked",
        "user_not_found",
    }
)
MAX_BODY_BYTES = 1_048_576
NAME_CACHE_SECONDS = 3600.0
_MENTION = re.compile(r"<@([UW][A-Z0-9]+)>")


@dataclass(frozen=True, slots=True)
class _Person:
    name: str
    email: str | None
    expires: float


class SlackChannel:
    """Slack in (Events API over HTTP, or Socket Mode) and out (`chat.postMessage`).

    Inbound requests are answered only after the message is committed to the inbox: 200 then,
    503 when the inbox failed (Slack retries; the retry carries the same `event_id`, which the
    inbox recognises, so a retry never produces a second reply).
    """

    channel_type = ChannelType.SLACK

    def __init__(
        self,
        settings: SlackSettings,
        inbox: InboxPort,
        threads: ThreadDirectory,
        *,
        on_rejected: Callable[[int, str], None] | None = None,
    ) -> None:
        if settings.mode == "http" and not settings.signing_secret.strip():
            raise ChannelAuthError(
                "channels.slack.signing_secret is required in http mode: without it inbound "
                "events cannot be verified"
            )
        if not settings.bot_token.strip():
            raise ChannelAuthError("channels.slack.bot_token is required")
        self.settings = settings
        self.inbox = inbox
        self.threads = threads
        self.on_rejected = on_rejected or (lambda _status, _reason: None)
        self.client = AsyncWebClient(token=settings.bot_token, base_url=settings.api_base_url)
        self.verifier = SignatureVerifier(settings.signing_secret or "unused-in-socket-mode")
        self.bot_user_id: str | None = None
        self.bot_id: str | None = None
        self._people: dict[str, _Person] = {}
        self._mention_threads: dict[tuple[str, str], float] = {}
        self._partial: dict[str, list[str]] = {}  # reply id → ts of the pieces already posted
        self._notices: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._socket: Any = None

        # bolt passes arguments by parameter name and counts `self` as one: hand it functions.
        async def authorize(enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
            return self._authorize(enterprise_id, team_id)

        async def allowed_team(
            body: dict[str, Any], next: Callable[[], Awaitable[None]]
        ) -> BoltResponse | None:
            return await self._allowed_team(body, next)

        async def on_event(body: dict[str, Any]) -> BoltResponse | None:
            return await self._on_event(body)

        async def on_shortcut(
            body: dict[str, Any], ack: Callable[..., Awaitable[Any]]
        ) -> BoltResponse | None:
            return await self._on_shortcut(body, ack)

        self.app = AsyncApp(
            # The token comes from `authorize`; this client only carries the base URL.
            client=AsyncWebClient(base_url=settings.api_base_url),
            signing_secret=settings.signing_secret or None,
            authorize=authorize,
            # The listener commits to the inbox before the response goes out (invariant 1).
            process_before_response=True,
            request_verification_enabled=settings.mode == "http",
            logger=logging.getLogger("slack_bolt.gateway"),
        )
        self.app.middleware(allowed_team)
        self.app.event(re.compile(r".+"))(on_event)
        self.app.shortcut(SHORTCUT_CALLBACK_ID)(on_shortcut)

    # --- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the bot token (`auth.test`) and, in socket mode, connect.

        A token Slack refuses stops the start-up (`ChannelAuthError`); an unreachable Slack
        only logs a warning, since inbound events carry the bot's user id anyway.
        """
        try:
            identity = await self.client.auth_test()
        except SlackApiError as exc:
            raise ChannelAuthError(f"Slack refused the bot token: {_error_code(exc)}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("slack.auth_test_failed", error=str(exc) or type(exc).__name__)
        else:
            self.bot_user_id = identity.get("user_id")
            self.bot_id = identity.get("bot_id")
            log.info("slack.connected", team=identity.get("team_id"), bot_user=self.bot_user_id)
        if self.settings.mode == "socket":
            self._socket = AsyncSocketModeHandler(self.app, self.settings.app_token)
            await self._socket.connect_async()
            log.info("slack.socket_mode_connected")

    async def close(self) -> None:
        """Disconnect Socket Mode and wait for polite notices still being posted."""
        if self._socket is not None:
            await self._socket.close_async()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def routes(self) -> list[Route]:
        """`POST /slack/events`: events, interactivity and shortcuts on one endpoint."""
        return [Route("/slack/events", self._http_request, methods=["POST"])]

    # --- inbound ----------------------------------------------------------------------------

    async def _http_request(self, request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return self._reject(413, "the request body is too large")
        reason = self._signature_problem(body, request.headers)
        if reason is not None:
            return self._reject(401, reason)
        try:
            text = body.decode()
            parsed = parse_body(text, request.headers.get("content-type"))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
            return self._reject(400, f"the body is not valid JSON or form data: {reason}")
        problem = shape_problem(parsed)
        if problem is not None:
            return self._reject(400, problem)
        bolt_request = AsyncBoltRequest(body=text, headers=dict(request.headers))
        answer = await self.app.async_dispatch(bolt_request)
        if answer.status == 404:
            # A request type nobody listens for: Slack must not retry it.
            log.debug("slack.request_ignored", reason="no listener")
            return Response(status_code=200)
        return to_starlette_response(answer)

    def _signature_problem(self, body: bytes, headers: Mapping[str, str]) -> str | None:
        timestamp = headers.get("x-slack-request-timestamp", "")
        signature = headers.get("x-slack-signature", "")
        if not timestamp or not signature:
            return "missing X-Slack-Signature or X-Slack-Request-Timestamp"
        if not timestamp.isdigit():
            return "X-Slack-Request-Timestamp is not a number"
        if abs(time.time() - int(timestamp)) > REPLAY_WINDOW_SECONDS:
            return "stale X-Slack-Request-Timestamp (more than 5 minutes off)"
        try:
            body.decode()
        except UnicodeDecodeError:
            # bolt's verifier decodes the body first; Slack signs the bytes, so check those
            # (a signed body that is not UTF-8 is then refused as malformed, with 400).
            expected = hmac.new(
                self.settings.signing_secret.encode(),
                f"v0:{timestamp}:".encode() + body,
                hashlib.sha256,
            ).hexdigest()
            return None if hmac.compare_digest(f"v0={expected}", signature) else "invalid signature"
        if not self.verifier.is_valid(body, timestamp, signature):
            return "invalid signature"
        return None

    def _reject(self, status: int, reason: str) -> Response:
        log.warning("slack.request_rejected", status=status, reason=reason)
        self.on_rejected(status, reason)
        return JSONResponse({"error": reason}, status_code=status)

    def _authorize(self, enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
        # No network call here: this runs before every event, inside Slack's 3-second limit.
        return AuthorizeResult(
            enterprise_id=enterprise_id,
            team_id=team_id,
            bot_user_id=self.bot_user_id,
            bot_id=self.bot_id,
            bot_token=self.settings.bot_token,
        )

    async def _allowed_team(
        self,
        body: dict[str, Any],
        next: Callable[[], Awaitable[None]],
    ) -> BoltResponse | None:
        allowed = self.settings.allowed_team_ids
        team = _team_of(body)
        if allowed and team not in allowed:
            reason = f"workspace {team or '(none)'} is not allowed"
            log.warning("slack.request_rejected", status=403, reason=reason)
            self.on_rejected(403, reason)
            return BoltResponse(status=403, body=reason)
        await next()
        return None

    async def _on_event(self, body: dict[str, Any]) -> BoltResponse | None:
        event = _mapping(body.get("event"))
        try:
            names = await self._names(str(event.get("text") or ""))
            message = parse_slack_event(body, names)
        except ChannelPayloadError as exc:
            log.warning("slack.event_rejected", reason=str(exc), event_id=body.get("event_id"))
            self.on_rejected(400, str(exc))
            return BoltResponse(status=400, body=str(exc))
        if message is None:
            log.debug(
                "slack.event_ignored",
                event_id=body.get("event_id"),
                type=event.get("type"),
                subtype=event.get("subtype"),
            )
            return None
        if not await self._addressed_to_us(event, message):
            log.debug("slack.event_ignored", event_id=message.message_id, reason="foreign thread")
            return None
        return await self._accept(message)

    async def _on_shortcut(
        self, body: dict[str, Any], ack: Callable[..., Awaitable[Any]]
    ) -> BoltResponse | None:
        shared = _mapping(body.get("message"))
        try:
            author = str(shared.get("user") or "")
            names = await self._names(str(shared.get("text") or ""), author)
            message = parse_slack_shortcut(body, names)
        except ChannelPayloadError as exc:
            log.warning("slack.shortcut_rejected", reason=str(exc))
            self.on_rejected(400, str(exc))
            return BoltResponse(status=400, body=str(exc))
        answer = await self._accept(message)
        if answer is None:
            await ack()
        return answer

    async def _addressed_to_us(self, event: Mapping[str, Any], message: ChannelMessage) -> bool:
        """Mentions and DMs are; a reply in a channel thread only when the thread is ours."""
        direct = event.get("channel_type") == "im" or message.channel_id.startswith("D")
        if event.get("type") == "app_mention" or direct:
            return True
        key = (message.channel_id, message.thread_id)
        if self._mention_threads.get(key, 0.0) > time.monotonic():
            return True  # started by a mention this process accepted, maybe not routed yet
        return await self.threads.has_thread(message.channel_id, message.thread_id)

    async def _accept(self, message: ChannelMessage) -> BoltResponse | None:
        if len(message.content) > self.settings.max_text_chars:
            reason = f"message longer than {self.settings.max_text_chars} characters"
            log.warning("slack.message_rejected", event_id=message.message_id, reason=reason)
            self.on_rejected(413, reason)
            self._notify(message, TOO_LONG_NOTICE.format(limit=self.settings.max_text_chars))
            return None
        try:
            await self.inbox.accept(message)
        except StorageError as exc:
            # Not acknowledged: Slack retries, and nothing is lost.
            log.error("slack.accept_failed", event_id=message.message_id, error=str(exc))
            return BoltResponse(status=503, body="temporarily unavailable, retry later")
        if message.thread_id and message.raw.get("event", {}).get("type") == "app_mention":
            expires = time.monotonic() + NAME_CACHE_SECONDS
            self._mention_threads[(message.channel_id, message.thread_id)] = expires
            if len(self._mention_threads) > 10_000:
                self._mention_threads.clear()
        return None

    def _notify(self, message: ChannelMessage, text: str) -> None:
        """Post a notice about a message the gateway will not answer (once per message)."""
        if message.message_id in self._notices:
            return  # Slack retried the event: the notice went out already
        self._notices.add(message.message_id)
        if len(self._notices) > 10_000:
            self._notices.clear()
        notice = OutboundMessage(
            message_id=f"notice:{message.message_id}",
            channel_type=ChannelType.SLACK,
            channel_id=message.channel_id,
            content=text,
            thread_id=message.thread_id,
            reply_context=message.reply_context,
        )
        task = asyncio.create_task(self._send_notice(notice))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_notice(self, notice: OutboundMessage) -> None:
        try:
            await self.send(notice)
        except DeliveryError as exc:
            log.warning("slack.notice_failed", channel=notice.channel_id, error=str(exc))

    # --- people -----------------------------------------------------------------------------

    async def _names(self, text: str, *authors: str) -> dict[str, str]:
        """Display names of the users mentioned in `text` and of `authors` (ids stay where a
        lookup fails)."""
        ids = {found for found in _MENTION.findall(text) if found != self.bot_user_id}
        ids.update(author for author in authors if author)
        # Looked up side by side: this runs before the acknowledgement, inside Slack's 3 s,
        # so a text with many mentions costs one lookup's time limit at most.
        wanted = sorted(ids)[:MAX_NAME_LOOKUPS]
        people = await asyncio.gather(*(self._person(user_id) for user_id in wanted))
        return {
            user_id: person.name
            for user_id, person in zip(wanted, people, strict=True)
            if person is not None
        }

    async def _person(self, user_id: str) -> _Person | None:
        cached = self._people.get(user_id)
        if cached is not None and cached.expires > time.monotonic():
            return cached
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_SECONDS):
                answer = await self.client.users_info(user=user_id)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.info("slack.user_lookup_failed", slack_user=user_id, error=str(exc)[:200])
            return None
        user = answer.get("user") or {}
        profile = user.get("profile") or {}
        name = profile.get("display_name") or profile.get("real_name") or user.get("name")
        person = _Person(
            name=str(name or user_id),
            email=profile.get("email"),
            expires=time.monotonic() + NAME_CACHE_SECONDS,
        )
        if len(self._people) > 10_000:
            self._people.clear()
        self._people[user_id] = person
        return person

    async def email_of(self, user_identifier: str) -> str | None:
        """The email address in a Slack user's profile (`TEAM:USER`), for `link_by_email`."""
        person = await self._person(user_identifier.rpartition(":")[2])
        return person.email if person is not None else None

    # --- outbound ---------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Post the reply in its conversation and thread, in pieces when it is long.

        Pieces already posted are remembered, so a retry after a failure part-way continues
        where it stopped instead of posting the first pieces again. A reply with a file is
        delivered only to a direct conversation (a permanent `DeliveryError` elsewhere).
        """
        context = message.reply_context
        channel = str(context.get("channel") or message.channel_id)
        thread_ts = context.get("thread_ts") or message.thread_id or None
        if message.file is not None and not channel.startswith(DIRECT_CONVERSATION_PREFIXES):
            # Files are exports of a whole session, DMs included; the commands send them only
            # to DMs, and this refuses the whole reply (its text names the file and a link)
            # should one ever be addressed to a channel.
            log.error("slack.file_refused", channel=channel, reply_id=message.message_id)
            raise DeliveryError(
                f"refusing to upload {message.file.filename} into {channel}, "
                "a conversation others can read",
                permanent=True,
            )
        pieces = split_for_slack(markdown_to_mrkdwn(message.content)) or ["…"]
        posted = self._partial.setdefault(message.message_id, [])
        for piece in pieces[len(posted) :]:
            answer = await self._call(
                message.message_id,
                self.client.chat_postMessage(
                    channel=channel, text=piece, thread_ts=thread_ts, mrkdwn=True
                ),
            )
            posted.append(str(answer.get("ts") or ""))
        if message.file is not None:
            # The file goes last: a retry after a failed upload posts no text twice.
            await self._call(
                message.message_id,
                self.client.files_upload_v2(
                    channel=channel,
                    thread_ts=thread_ts,
                    content=message.file.content,
                    filename=message.file.filename,
                    title=message.file.filename,
                ),
            )
        self._partial.pop(message.message_id, None)
        return DeliveryReceipt(platform_message_id=posted[0] if posted else None)

    async def _call(self, reply_id: str, call: Awaitable[Any]) -> Any:
        """One Web API call of a send, its failures as `DeliveryError`s."""
        try:
            return await call
        except SlackApiError as exc:
            error = _delivery_error(exc)
            if error.permanent:
                self._partial.pop(reply_id, None)
            raise error from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeliveryError(f"Slack unreachable: {exc or type(exc).__name__}") from exc


REPLAY_WINDOW_SECONDS = 300
# Conversations only the user and the app share: a DM (D…), or a user id (U…, W…), which Slack
# delivers to the app's DM with that user.
DIRECT_CONVERSATION_PREFIXES = ("D", "U", "W")
LOOKUP_TIMEOUT_SECONDS = 1.0
MAX_NAME_LOOKUPS = 20
TOO_LONG_NOTICE = (
    "Sorry, that message is too long for me (the limit is {limit} characters). "
    "Could you shorten it or send it in parts?"
)


# Fields of an envelope or interactivity payload and the shapes slack-bolt relies on.
_SHAPES: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("type", (str,)),
    ("team_id", (str,)),
    ("event_id", (str,)),
    ("api_app_id", (str,)),
    ("event", (dict,)),
    ("authorizations", (list,)),
    ("team", (dict, str)),
    ("user", (dict, str)),
    ("channel", (dict, str)),
    ("enterprise", (dict, str)),
    ("message", (dict,)),
)


def shape_problem(body: object) -> str | None:
    """Why a parsed request cannot be a Slack event or interaction (None when it can be).

    Checked before slack-bolt sees it: bolt assumes these shapes and fails with a 500 on others.
    """
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    for name, shapes in _SHAPES:
        value = body.get(name)
        if value is not None and not isinstance(value, shapes):
            return f"'{name}' has the wrong type"
    if "event" in body and not isinstance(body["event"], dict):
        return "'event' must be an object"
    event = body.get("event")
    if isinstance(event, dict):
        if not isinstance(event.get("type"), str):
            return "'event.type' must be a string"
        fields = ("user", "channel", "subtype", "ts", "thread_ts", "bot_id", "text")
        # Other event types (channel_created …) use these names for objects; they are ignored.
        for name in fields if event["type"] in ("message", "app_mention") else ():
            value = event.get(name)
            if value is not None and not isinstance(value, str):
                return f"'event.{name}' must be a string"
    if not all(isinstance(item, dict) for item in body.get("authorizations") or ()):
        return "'authorizations' must be a list of objects"
    return None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _team_of(body: Mapping[str, Any]) -> str:
    team = body.get("team_id") or ""
    if not team and isinstance(body.get("team"), Mapping):
        team = body["team"].get("id") or ""
    if not team and isinstance(body.get("user"), Mapping):
        team = body["user"].get("team_id") or ""
    return str(team)


def _error_code(exc: SlackApiError) -> str:
    data = exc.response.data if exc.response is not None else None
    return str(data.get("error", "")) if isinstance(data, Mapping) else ""


def _delivery_error(exc: SlackApiError) -> DeliveryError:
    status = exc.response.status_code if exc.response is not None else 0
    code = _error_code(exc) or f"HTTP {status}"
    if status == 429 or code == "ratelimited":
        headers = exc.response.headers if exc.response is not None else {}
        retry_after = _retry_after(headers)
        return DeliveryError(f"Slack rate limit ({code})", retry_after=retry_after)
    return DeliveryError(f"Slack refused the message: {code}", permanent=code in PERMANENT_ERRORS)


def _retry_after(headers: Mapping[str, Any]) -> float:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            raw = value[0] if isinstance(value, list | tuple) else value
            try:
                return max(float(raw), 0.0)
            except (TypeError, ValueError):
                break
    return 1.0
