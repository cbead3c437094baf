"""The Microsoft Teams channel, on the Bot Framework SDK (botbuilder 4.17).

`POST /api/messages` receives activities: the JWT in `Authorization` is validated first
(`teams_auth`), then the activity is parsed (`teams_activity`, pure) and handed to the inbox;
Teams gets its 200 only after the inbox committed the message, 503 when it could not (Teams
resends). Replies go out through the Bot Connector at the activity's service URL, addressed by
the conversation reference the parse step put into `reply_context`, so the outbox can send
them long after the request (proactive messaging), into the same reply chain.

Live replies (`channels.live.LiveChannel`): `live_reply` streams the answer into a personal
chat or shows a typing indicator elsewhere (`channels.teams.live`), and `send` finishes a
streamed reply with its final message instead of posting a second one. Files people send are
fetched when the turn runs (`channels.files.FileChannel`, `channels.teams.files`).

Bot Framework specifics stay in this package, so a move to the M365 Agents SDK touches only it.

HTTP answers: 200 (accepted, duplicate, ignored, or answered in chat), 400 malformed activity,
401 failed authentication or tenant not allowed, 413 body too large, 503 message not stored or
signing keys unavailable. Every refusal is logged (`teams.auth_rejected`, `teams.rejected`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import structlog
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from channels.base import (
    Attachment,
    ChannelType,
    DeliveryReceipt,
    InboxPort,
    OutboundMessage,
    RefusalResponse,
    parse_json,
    read_body,
)
from channels.live import LiveReply, ReplyTarget, live_handle
from channels.teams.auth import (
    BOT_FRAMEWORK_ISSUER,
    DEFAULT_OPENID_METADATA_URL,
    DEFAULT_SCOPE,
    DEFAULT_TOKEN_URL,
    ActivityAuthenticator,
    BotCredentials,
    SigningKeys,
    SigningKeysUnavailableError,
    TeamsCredentialsFactory,
)
from channels.teams.connector import ChatPace, TeamsConnector, message_activity
from channels.teams.files import TeamsFiles
from channels.teams.live import LIVE_INTERVAL, TeamsStreams
from channels.teams.parse import (
    bot_was_added,
    conversation_reference,
    ignore_reason,
    parse_teams_activity,
    tenant_of,
)
from errors import (
    ChannelAuthError,
    ChannelPayloadError,
    ConfigError,
    DeliveryError,
    RejectedRequestError,
    StorageError,
)

__all__ = ["TeamsChannel", "TeamsSettings", "parse_teams_activity"]

log = structlog.stdlib.get_logger(__name__)

MAX_BODY_BYTES = 1_048_576
WELCOME_TEXT = (
    "Hello! I'm your assistant. Write to me here, or mention me in a channel to ask something "
    "there. Type /help to see the commands."
)


@dataclass(frozen=True, slots=True)
class TeamsSettings:
    """The Teams channel's configuration (the gateway builds it from `channels.teams`).

    Empty `openid_metadata_url` / `oauth_token_url` mean the public cloud's endpoints; the
    issuer and scope change only for sovereign clouds.
    """

    app_id: str
    app_password: str
    tenant_ids: tuple[str, ...] = ()
    openid_metadata_url: str | None = None
    oauth_token_url: str | None = None
    insecure_dev_mode: bool = False
    max_text_chars: int = 16_000  # longer → a polite chat reply, not processed
    streaming: bool = True  # live replies: streamed in personal chats, typing elsewhere
    token_issuer: str = BOT_FRAMEWORK_ISSUER
    oauth_scope: str = DEFAULT_SCOPE
    request_timeout: float = 30.0  # also the limit for fetching one file
    file_hosts: tuple[str, ...] = ()  # more hosts files may come from (`channels.teams.files`)


class TeamsChannel:
    """The Teams channel: its HTTP route, and sending replies through the Bot Connector."""

    channel_type = ChannelType.TEAMS
    # Teams takes about one request a second per chat (`ChatPace` holds every chat to it).
    live_interval = LIVE_INTERVAL

    def __init__(
        self,
        settings: TeamsSettings,
        inbox: InboxPort,
        *,
        clock: Callable[[], datetime],
        on_rejected: Callable[[int, str], None] | None = None,
        pace: ChatPace | None = None,
    ) -> None:
        """Raises `ConfigError` without an app id and password, unless `insecure_dev_mode`.
        `pace` spaces the live requests to each chat (one a second unless a test says)."""
        for key, value in (("app_id", settings.app_id), ("app_password", settings.app_password)):
            if not value.strip() and not settings.insecure_dev_mode:
                raise ConfigError(
                    f"channels.teams.{key} is required (unless insecure_dev_mode: true)"
                )
        self.settings = settings
        self.inbox = inbox
        self.clock = clock
        self.on_rejected = on_rejected or (lambda _status, _reason: None)
        self._http = httpx.AsyncClient(timeout=settings.request_timeout)
        self._credentials = BotCredentials(
            settings.app_id,
            settings.app_password,
            token_url=settings.oauth_token_url or DEFAULT_TOKEN_URL,
            scope=settings.oauth_scope,
            http=self._http,
        )
        keys = SigningKeys(settings.openid_metadata_url or DEFAULT_OPENID_METADATA_URL, self._http)
        self._authenticator = ActivityAuthenticator(
            TeamsCredentialsFactory(settings.app_id, self._credentials),
            keys,
            issuer=settings.token_issuer,
        )
        self._connector = TeamsConnector(
            self._credentials, request_timeout=settings.request_timeout, clock=clock
        )
        self._files = TeamsFiles(
            self._credentials,
            self._http,
            file_hosts=settings.file_hosts,
            trust_service_url=not settings.insecure_dev_mode,
            timeout=settings.request_timeout,
        )
        self._streams = TeamsStreams(self._connector, pace or ChatPace(LIVE_INTERVAL), clock=clock)
        if settings.insecure_dev_mode:
            log.warning(
                "teams.verification_disabled",
                reason="insecure_dev_mode: inbound JWTs are not verified",
            )

    def routes(self) -> list[Route]:
        """The channel's route, mounted by the gateway's app."""
        return [Route("/api/messages", self.post_activity, methods=["POST"])]

    async def post_activity(self, request: Request) -> Response:
        """Authenticate, parse and store one activity; 200 only once the inbox committed it."""
        try:
            activity = await _activity_body(request)
            await self._authenticate(request, activity)
        except SigningKeysUnavailableError as exc:
            return self._refuse(RejectedRequestError(503, str(exc)), "teams.rejected")
        except ChannelAuthError as exc:
            return self._refuse(RejectedRequestError(401, str(exc)), "teams.auth_rejected")
        except RejectedRequestError as exc:
            return self._refuse(exc, "teams.rejected")
        return await self._handle(activity)

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Post a reply (Markdown) where `reply_context` points; a streamed reply finishes its
        stream instead (`TeamsStreams.finish`). Raises `DeliveryError`."""
        reference = message.reply_context.get("conversation_reference")
        if not isinstance(reference, Mapping) or not reference.get("serviceUrl"):
            raise DeliveryError("no Teams conversation reference to reply to", permanent=True)
        thread = message.thread_id or str(message.reply_context.get("thread_root") or "")
        live = live_handle(message)
        if live is not None:
            return await self._streams.finish(reference, thread, message.content, live)
        return await self._streams.plain(reference, thread, message.content)

    def live_reply(
        self, target: ReplyTarget, *, resume: Mapping[str, Any] | None = None
    ) -> LiveReply | None:
        """The turn's live reply: a stream in a personal chat, typing elsewhere; None when
        `channels.teams.streaming` is off. With `resume`, no new stream is started."""
        if not self.settings.streaming and resume is None:
            return None
        return self._streams.reply(target, resume)

    async def fetch_attachment(self, attachment: Attachment, *, max_bytes: int) -> bytes:
        """A file someone sent (`TeamsFiles.fetch`); raises `AttachmentError` with the reason
        the user reads."""
        return await self._files.fetch(attachment, max_bytes=max_bytes)

    async def open(self) -> None:
        """Nothing to open: the connector's clients are opened per service URL and kept."""

    async def start(self) -> None:
        """Nothing to open: activities arrive on the HTTP route."""

    def reconfigure(self, settings: TeamsSettings) -> None:
        """Apply the reloaded tenant allow-list, text limit and streaming switch to the next
        activity and turn, and the file hosts to the next fetch (the app credentials and
        endpoints need a restart)."""
        self.settings = settings
        self._files.file_hosts = settings.file_hosts

    async def stop(self) -> None:
        """Close the connector sessions and the HTTP client; drop the keys from the SDK's cache."""
        await self._connector.close()
        self._authenticator.forget_keys()
        await self._http.aclose()

    async def _authenticate(self, request: Request, activity: Mapping[str, Any]) -> None:
        if not self.settings.insecure_dev_mode:
            await self._authenticator.authenticate(
                request.headers.get("authorization"),
                channel_id=str(activity["channelId"]),
                service_url=str(activity["serviceUrl"]),
            )
        tenant = tenant_of(activity)
        if self.settings.tenant_ids and tenant not in self.settings.tenant_ids:
            raise ChannelAuthError(f"tenant {tenant or '(none)'} not allowed")

    async def _handle(self, activity: Mapping[str, Any]) -> Response:
        bot_id = self.settings.app_id
        try:
            added = bot_was_added(activity, bot_id=bot_id)
            reference = conversation_reference(activity) if added else None
            message = (
                None
                if added
                else parse_teams_activity(activity, bot_id=bot_id, received_at=self.clock())
            )
        except ChannelPayloadError as exc:
            return self._refuse(RejectedRequestError(400, str(exc)))
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            # A field of the wrong shape somewhere in the activity.
            return self._refuse(
                RejectedRequestError(400, f"malformed activity: {type(exc).__name__}: {exc}")
            )
        if reference is not None:
            await self._reply_quietly(reference, "", WELCOME_TEXT)
            return Response(status_code=200)
        if message is None:
            log.info(
                "teams.ignored",
                reason=_ignore_reason(activity, bot_id),
                activity_id=activity.get("id"),
            )
            return Response(status_code=200)
        if len(message.content) > self.settings.max_text_chars:
            reason = f"message longer than {self.settings.max_text_chars} characters"
            self._log_refusal(413, reason, "teams.rejected")
            text = (
                f"Sorry, that message is too long for me ({len(message.content)} characters; "
                f"the limit is {self.settings.max_text_chars}). Could you shorten it?"
            )
            context = message.reply_context
            await self._reply_quietly(
                context["conversation_reference"], context["thread_root"], text
            )
            return Response(status_code=200)
        try:
            result = await self.inbox.accept(message)
        except StorageError as exc:
            return self._refuse(
                RejectedRequestError(503, f"the message could not be stored: {exc}")
            )
        log.info("teams.accepted", message_id=message.message_id, duplicate=not result.accepted)
        return Response(status_code=200)

    async def _reply_quietly(self, reference: Mapping[str, Any], thread: str, text: str) -> None:
        """A message the channel sends by itself (welcome, refusal); failures are only logged:
        it is a courtesy, and Teams must still get its 200 so it does not resend."""
        try:
            async with asyncio.timeout(self.settings.request_timeout):
                await self._post(reference, text, thread)
        except (DeliveryError, TimeoutError) as exc:
            log.warning("teams.courtesy_reply_failed", error=str(exc))

    async def _post(self, reference: Mapping[str, Any], text: str, thread: str) -> DeliveryReceipt:
        identifier = await self._connector.post(reference, thread, message_activity(text))
        return DeliveryReceipt(platform_message_id=identifier)

    def _refuse(self, refusal: RejectedRequestError, event: str = "teams.rejected") -> Response:
        self._log_refusal(refusal.status, refusal.reason, event)
        return RefusalResponse(refusal.status, refusal.reason)

    def _log_refusal(self, status: int, reason: str, event: str) -> None:
        log.warning(event, status=status, reason=reason)
        self.on_rejected(status, reason)


def _ignore_reason(activity: Mapping[str, Any], bot_id: str) -> str:
    try:
        return ignore_reason(activity, bot_id=bot_id) or "ignored"
    except (TypeError, ValueError, AttributeError):
        return "unreadable activity"


async def _activity_body(request: Request) -> dict[str, Any]:
    """The activity JSON; refuses what is too large or not an activity at all."""
    raw = await read_body(request, MAX_BODY_BYTES)
    try:
        body = parse_json(raw)
    except ChannelPayloadError as exc:
        raise RejectedRequestError(400, str(exc)) from exc
    if not isinstance(body, dict):
        raise RejectedRequestError(400, "the body must be a JSON object (an activity)")
    # Authentication needs these two; without serviceUrl the SDK would skip its claim check.
    for field in ("type", "channelId", "serviceUrl"):
        if not isinstance(body.get(field), str) or not body[field]:
            raise RejectedRequestError(400, f"an activity needs '{field}'")
    return body
