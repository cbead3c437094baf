"""Slack in: what slack-bolt calls for each verified request or Socket Mode envelope.

`SlackInbound` authorizes the bot, keeps out workspaces not on the allow-list, and turns
events and the "Send to assistant" shortcut into `ChannelMessage`s (`parse.py`) committed to
the inbox before bolt answers. bolt injects arguments by parameter name, so the methods it
calls are named as it expects (`body`, `next`, `ack`, `enterprise_id`, `team_id`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog
from slack_bolt import BoltResponse
from slack_bolt.authorization import AuthorizeResult

from channels.base import (
    ChannelMessage,
    ChannelType,
    DeliveryReceipt,
    InboxPort,
    OutboundMessage,
)
from channels.plugin import ThreadDirectory
from channels.slack.assistant import ASSISTANT_EVENTS, SlackAssistant
from channels.slack.parse import parse_slack_event, parse_slack_shortcut
from channels.slack.people import CACHED_ENTRIES, NAME_CACHE_SECONDS, SlackPeople
from errors import ChannelPayloadError, DeliveryError, StorageError
from primitives.bounded_cache import BoundedCache

if TYPE_CHECKING:
    from channels.slack.adapter import SlackSettings

log = structlog.stdlib.get_logger(__name__)

TOO_LONG_NOTICE = (
    "Sorry, that message is too long for me (the limit is {limit} characters). "
    "Could you shorten it or send it in parts?"
)


class SlackInbound:
    """From bolt to the inbox: an event is answered only once its message is committed (200
    then, 503 when the inbox failed, so that Slack retries with the same `event_id`)."""

    def __init__(
        self,
        settings: SlackSettings,
        inbox: InboxPort,
        threads: ThreadDirectory,
        people: SlackPeople,
        *,
        send: Callable[[OutboundMessage], Awaitable[DeliveryReceipt]],
        on_rejected: Callable[[int, str], None],
        assistant: SlackAssistant | None = None,
    ) -> None:
        self.settings = settings
        self.inbox = inbox
        self.threads = threads
        self.people = people
        self.send = send
        self.on_rejected = on_rejected
        self.assistant = assistant
        self.bot_user_id: str | None = None  # known once `auth.test` answered
        self.bot_id: str | None = None
        self._mention_threads: BoundedCache[tuple[str, str], bool] = BoundedCache(
            CACHED_ENTRIES, ttl=NAME_CACHE_SECONDS
        )
        self._notices: BoundedCache[str, bool] = BoundedCache(CACHED_ENTRIES)
        self._tasks: set[asyncio.Task[None]] = set()

    async def authorize(self, enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
        """The bot's token and identity, for every workspace (a single-workspace app)."""
        # No network call here: this runs before every event, inside Slack's 3-second limit.
        return AuthorizeResult(
            enterprise_id=enterprise_id,
            team_id=team_id,
            bot_user_id=self.bot_user_id,
            bot_id=self.bot_id,
            bot_token=self.settings.bot_token,
        )

    async def allowed_team(
        self, body: dict[str, Any], next: Callable[[], Awaitable[None]]
    ) -> BoltResponse | None:
        """Middleware: 403 for a workspace missing from a non-empty `allowed_team_ids`."""
        allowed = self.settings.allowed_team_ids
        team = _team_of(body)
        if allowed and team not in allowed:
            reason = f"workspace {team or '(none)'} is not allowed"
            log.warning("slack.request_rejected", status=403, reason=reason)
            self.on_rejected(403, reason)
            return BoltResponse(status=403, body=reason)
        await next()
        return None

    async def on_event(self, body: dict[str, Any]) -> BoltResponse | None:
        """An Events API event: to the inbox when it is a message addressed to the bot; the
        agent surface's events (a new assistant thread, the messages tab opened) to
        `SlackAssistant`, never to the inbox."""
        event = _mapping(body.get("event"))
        if event.get("type") in ASSISTANT_EVENTS:
            log.debug("slack.assistant_event", event_id=body.get("event_id"), type=event["type"])
            if self.assistant is not None:
                self.assistant.handle(body)
            return None
        try:
            names = await self.people.names(
                str(event.get("text") or ""), bot_user_id=self.bot_user_id
            )
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

    async def on_shortcut(
        self, body: dict[str, Any], ack: Callable[..., Awaitable[Any]]
    ) -> BoltResponse | None:
        """The "Send to assistant" message shortcut: the shared message to the inbox."""
        shared = _mapping(body.get("message"))
        try:
            author = str(shared.get("user") or "")
            names = await self.people.names(
                str(shared.get("text") or ""), [author], bot_user_id=self.bot_user_id
            )
            message = parse_slack_shortcut(body, names)
        except ChannelPayloadError as exc:
            log.warning("slack.shortcut_rejected", reason=str(exc))
            self.on_rejected(400, str(exc))
            return BoltResponse(status=400, body=str(exc))
        answer = await self._accept(message)
        if answer is None:
            await ack()
        return answer

    async def finish_notices(self) -> None:
        """Wait for the notices still being posted."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _addressed_to_us(self, event: Mapping[str, Any], message: ChannelMessage) -> bool:
        """Mentions and DMs are; a reply in a channel thread only when the thread is ours."""
        if event.get("type") == "app_mention" or message.is_private:
            return True
        key = (message.channel_id, message.thread_id)
        if self._mention_threads.get(key):
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
            self._mention_threads.put((message.channel_id, message.thread_id), True)
        return None

    def _notify(self, message: ChannelMessage, text: str) -> None:
        """Post a notice about a message the gateway will not answer (once per message)."""
        if self._notices.get(message.message_id):
            return  # Slack retried the event: the notice went out already
        self._notices.put(message.message_id, True)
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


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _team_of(body: Mapping[str, Any]) -> str:
    team = body.get("team_id") or ""
    if not team and isinstance(body.get("team"), Mapping):
        team = body["team"].get("id") or ""
    if not team and isinstance(body.get("user"), Mapping):
        team = body["user"].get("team_id") or ""
    return str(team)
