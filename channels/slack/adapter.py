"""The Slack channel: Events API (HTTP) or Socket Mode in, `chat.postMessage` out.

`SlackChannel` owns the channel's life cycle and wires its parts together: slack-bolt's
`AsyncApp`, which dispatches to `SlackInbound` (`inbound.py`: allow-list, events and the
"Send to assistant" shortcut, into the inbox); the HTTP endpoint, whose requests are checked
once, before bolt sees them (`endpoint.py`: size, signature, shapes); `SlackSender` for replies
(`send.py`) and `SlackPeople` for names and email addresses (`people.py`).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import structlog
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from channels.base import ChannelType, DeliveryReceipt, InboxPort, OutboundMessage
from channels.plugin import ThreadDirectory
from channels.slack.endpoint import bolt_response, verified_body
from channels.slack.inbound import SlackInbound
from channels.slack.parse import SHORTCUT_CALLBACK_ID
from channels.slack.people import SlackPeople
from channels.slack.send import SlackSender, error_code
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
        self.on_rejected = on_rejected or (lambda _status, _reason: None)
        self.client = AsyncWebClient(token=settings.bot_token, base_url=settings.api_base_url)
        self.people = SlackPeople(self.client)
        self.sender = SlackSender(self.client)
        self.inbound = SlackInbound(
            settings,
            inbox,
            threads,
            self.people,
            send=self.sender.send,
            on_rejected=self.on_rejected,
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

    async def start(self) -> None:
        """Check the bot token (`auth.test`) and, in socket mode, connect.

        A token Slack refuses stops the start-up (`ChannelAuthError`); an unreachable Slack
        only logs a warning, since inbound events carry the bot's user id anyway.
        """
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
        """Apply the reloaded workspace allow-list and text limit to the next event (tokens,
        the signing secret and the mode need a restart)."""
        self.settings = settings
        self.inbound.settings = settings

    async def stop(self) -> None:
        """Disconnect Socket Mode and wait for polite notices still being posted."""
        if self._socket is not None:
            await self._socket.close_async()
        await self.inbound.finish_notices()

    def routes(self) -> list[Route]:
        """`POST /slack/events`: events, interactivity and shortcuts on one endpoint (none in
        socket mode, where events come over the socket)."""
        if self.settings.mode == "socket":
            return []
        return [Route("/slack/events", self._http_request, methods=["POST"])]

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Post the reply in its conversation and thread (see `SlackSender.send`)."""
        return await self.sender.send(message)

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
        return JSONResponse({"error": reason}, status_code=status)
