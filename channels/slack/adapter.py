"""The Slack channel: Events API (HTTP) or Socket Mode in, `chat.postMessage` out.

`SlackChannel` owns the channel's life cycle and wires its parts together: slack-bolt's
`AsyncApp`, which dispatches to `SlackInbound` (`inbound.py`: allow-list, events and the
"Send to assistant" shortcut, into the inbox); the HTTP endpoint, whose requests are checked
once, before bolt sees them (`endpoint.py`: size, signature, shapes); `SlackSender` for replies
(`send.py`) and `SlackPeople` for names and email addresses (`people.py`). It is a
`channels.live.LiveChannel`: answers are shown while they are written (`live.py`), and the
final send finishes that message (`finish.py`); `SlackAssistant` (`assistant.py`) answers the
agent surface's events (greeting, suggested prompts). It is a `channels.files.FileChannel`: the
files people send are downloaded when the turn runs (`files.py`).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import structlog
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from channels.base import (
    Attachment,
    ChannelType,
    Conversation,
    DeliveryReceipt,
    InboxPort,
    OutboundMessage,
    RefusalResponse,
)
from channels.download import DOWNLOAD_TIMEOUT
from channels.live import ReplyTarget
from channels.plugin import ThreadDirectory
from channels.slack.assistant import AssistantSettings, SlackAssistant
from channels.slack.endpoint import bolt_response, verified_body
from channels.slack.files import SlackFiles
from channels.slack.handle import LiveMessage, StreamedText
from channels.slack.inbound import SlackInbound
from channels.slack.live import LIVE_INTERVAL, LiveShared, SlackLiveReply, live_place
from channels.slack.parse import SHORTCUT_CALLBACK_ID
from channels.slack.people import SlackPeople
from channels.slack.refusals import error_code
from channels.slack.send import SlackSender
from errors import ChannelAuthError, ChannelPayloadError, RejectedRequestError

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
    streaming: bool = True
    assistant: AssistantSettings = field(default_factory=AssistantSettings)
    file_timeout: float = DOWNLOAD_TIMEOUT  # seconds to fetch one file, lookup included


class SlackChannel:
    """Slack in (Events API over HTTP, or Socket Mode) and out (`chat.postMessage`).

    Inbound requests are answered only after the message is committed to the inbox: 200 then,
    503 when the inbox failed (Slack retries; the retry carries the same `event_id`, which the
    inbox recognises, so a retry never produces a second reply).
    """

    channel_type = ChannelType.SLACK
    # One update a second per answer: Slack's pace for one message; `pacing.py` keeps many
    # answers at once within each method's per-workspace limit.
    live_interval = LIVE_INTERVAL

    def __init__(
        self,
        settings: SlackSettings,
        inbox: InboxPort,
        threads: ThreadDirectory,
        *,
        on_rejected: Callable[[int, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if settings.mode == "http" and not settings.signing_secret.strip():
            raise ChannelAuthError(
                "channels.slack.signing_secret is required in http mode: without it inbound "
                "events cannot be verified"
            )
        if not settings.bot_token.strip():
            raise ChannelAuthError("channels.slack.bot_token is required")
        self.settings = settings
        self.on_rejected = on_rejected or (lambda _status, _reason: None)
        self.client = AsyncWebClient(token=settings.bot_token, base_url=settings.api_base_url)
        self.people = SlackPeople(self.client)
        self.files = SlackFiles(
            self.client,
            bot_token=settings.bot_token,
            api_base_url=settings.api_base_url,
            timeout=settings.file_timeout,
        )
        streamed = StreamedText()
        self.live = LiveShared(streamed=streamed, clock=clock)
        self.sender = SlackSender(self.client, streamed)
        self.assistant = SlackAssistant(self.client, settings.assistant)
        self.inbound = SlackInbound(
            settings,
            inbox,
            threads,
            self.people,
            send=self.sender.send,
            on_rejected=self.on_rejected,
            assistant=self.assistant,
        )
        self._socket: Any = None
        self.app = AsyncApp(
            # The token comes from `authorize`; this client only carries the base URL.
            client=AsyncWebClient(base_url=settings.api_base_url),
            # bolt injects arguments by parameter name; it leaves out a listener's `self` but
            # not an authorize function's, so this one gets the instance bound beforehand.
            authorize=functools.partial(SlackInbound.authorize, self.inbound),
            # The listener commits to the inbox before the response goes out (invariant 1).
            process_before_response=True,
            # HTTP requests are verified before bolt sees them (`endpoint.verified_body`);
            # Socket Mode envelopes are not signed.
            request_verification_enabled=False,
            logger=logging.getLogger("slack_bolt.gateway"),
        )
        self.app.middleware(self.inbound.allowed_team)
        self.app.event(re.compile(r".+"))(self.inbound.on_event)
        self.app.shortcut(SHORTCUT_CALLBACK_ID)(self.inbound.on_shortcut)

    async def open(self) -> None:
        """Open the Web API's connection pool (once): one for every Web API call, in the
        process that accepts and in each turn worker. Without a session of its own the SDK
        opens (and closes) a connection, with its TLS handshake, for each call."""
        if self.client.session is None:
            timeout = aiohttp.ClientTimeout(total=self.client.timeout)
            self.client.session = aiohttp.ClientSession(timeout=timeout)

    async def start(self) -> None:
        """Open the connection pool if `open` has not, check the bot token (`auth.test`) and,
        in socket mode, connect.

        A token Slack refuses stops the start-up (`ChannelAuthError`); an unreachable Slack
        only logs a warning, since inbound events carry the bot's user id anyway.
        """
        await self.open()
        try:
            await self._connect()
        except BaseException:
            session, self.client.session = self.client.session, None
            if session is not None:
                await session.close()  # a failed start is not stopped
            raise

    async def _connect(self) -> None:
        try:
            identity = await self.client.auth_test()
        except SlackApiError as exc:
            raise ChannelAuthError(f"Slack refused the bot token: {error_code(exc)}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("slack.auth_test_failed", error=str(exc) or type(exc).__name__)
        else:
            self.inbound.bot_user_id = identity.get("user_id")
            self.inbound.bot_id = identity.get("bot_id")
            log.info(
                "slack.connected", team=identity.get("team_id"), bot_user=identity.get("user_id")
            )
        if self.settings.mode == "socket":
            self._socket = AsyncSocketModeHandler(self.app, self.settings.app_token)
            await self._socket.connect_async()
            log.info("slack.socket_mode_connected")

    def reconfigure(self, settings: SlackSettings) -> None:
        """Apply the reloaded workspace allow-list, text limit, streaming switch and agent
        surface to the next event (tokens, the signing secret and the mode need a restart)."""
        self.settings = settings
        self.inbound.settings = settings
        self.assistant.reconfigure(settings.assistant)

    async def stop(self) -> None:
        """Disconnect Socket Mode, wait for polite notices still being posted, and close the
        connection pool (a call after that opens a connection of its own)."""
        if self._socket is not None:
            await self._socket.close_async()
        await self.inbound.finish_notices()
        await self.assistant.finish()
        await self.files.close()
        if self.client.session is not None:
            await self.client.session.close()

    def routes(self) -> list[Route]:
        """`POST /slack/events`: events, interactivity and shortcuts on one endpoint (none in
        socket mode, where events come over the socket)."""
        if self.settings.mode == "socket":
            return []
        return [Route("/slack/events", self._http_request, methods=["POST"])]

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Post the reply in its conversation and thread (see `SlackSender.send`)."""
        return await self.sender.send(message)

    def live_reply(
        self, target: ReplyTarget, *, resume: Mapping[str, Any] | None = None
    ) -> SlackLiveReply | None:
        """The turn's answer shown while it is written (`live.py`); None when
        `channels.slack.streaming` is off. With `resume` (the handle of an attempt whose
        process died) no message is created: status only, and the send finishes that one."""
        if not self.settings.streaming:
            return None
        message = LiveMessage.from_handle(resume) if resume is not None else None
        return SlackLiveReply(
            self.client, live_place(target), self.live, resume=message, resumed=resume is not None
        )

    async def set_title(self, target: ReplyTarget, title: str) -> None:
        """Name the assistant thread the target is in (`assistant.threads.setTitle`); other
        conversations have no title. Failures are logged, never raised."""
        place = live_place(target)
        if target.conversation is not Conversation.DIRECT or place.thread_ts is None:
            return
        try:
            await self.client.assistant_threads_setTitle(
                channel_id=place.channel, thread_ts=place.thread_ts, title=title[:255]
            )
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.info("slack.title_not_set", channel=place.channel, error=str(exc))

    async def fetch_attachment(self, attachment: Attachment, *, max_bytes: int) -> bytes:
        """A file someone sent, downloaded with the bot token (`SlackFiles.fetch`); raises
        `AttachmentError` with the reason the user reads."""
        return await self.files.fetch(attachment, max_bytes=max_bytes)

    async def email_of(self, user_identifier: str) -> str | None:
        """The email address in a Slack user's profile (`TEAM:USER`), for `link_by_email`."""
        return await self.people.email_of(user_identifier)

    async def _http_request(self, request: Request) -> Response:
        try:
            text = await verified_body(request, self.settings.signing_secret)
        except RejectedRequestError as exc:
            return self._reject(exc.status, exc.reason)
        except ChannelPayloadError as exc:
            return self._reject(400, str(exc))
        return await bolt_response(self.app, text, request.headers)

    def _reject(self, status: int, reason: str) -> Response:
        log.warning("slack.request_rejected", status=status, reason=reason)
        self.on_rejected(status, reason)
        return RefusalResponse(status, reason)
