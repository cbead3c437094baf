"""Posting activities to the Bot Connector: the outbound wire of the Teams channel.

`TeamsConnector.post` addresses an activity with a stored conversation reference (the reply
chain of a channel thread included), sends it with the bot's token through the SDK's
`ConnectorClient` (one per service URL, the SDK's own retries off: the outbox and the live
replies own retries and honour Retry-After) and returns the id the connector gave it.
Failures are `ConnectorError`s: a `DeliveryError` that also keeps the HTTP status and the
connector's error code, which the live replies read (403 `ContentStreamNotAllowed`: the user
stopped a stream).

`ChatPace` spaces the requests to one chat: Teams allows about one a second per chat, and a
live reply's updates and its final message count together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import requests
from botbuilder.core import TurnContext  # type: ignore[import-untyped]  # (untyped SDK)
from botbuilder.schema import (  # type: ignore[import-untyped]
    Activity,
    ActivityTypes,
    ConversationReference,
    TextFormatTypes,
)
from botframework.connector.aio import ConnectorClient  # type: ignore[import-untyped]
from msrest.exceptions import ClientRequestError, HttpOperationError

from channels.teams.auth import BotCredentials
from channels.teams.parse import REPLY_CHAIN_MARKER, split_conversation_id
from errors import DeliveryError
from primitives.bounded_cache import BoundedCache

CONNECTOR_CLIENTS = 100  # Bot Connector clients kept, one per service URL (Teams has a few)
PACED_CHATS = 10_000  # chats whose last request time is remembered
_PERMANENT_STATUSES = range(400, 500)
_THROTTLED_STATUSES = (429, 503)


class ConnectorError(DeliveryError):
    """The Bot Connector refused or failed an activity: `status` is the HTTP status (0 when
    no answer came) and `code` the connector's error code ("ContentStreamNotAllowed")."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        code: str = "",
        detail: str = "",
        retry_after: float | None = None,
        permanent: bool = False,
    ) -> None:
        super().__init__(message, retry_after=retry_after, permanent=permanent)
        self.status = status
        self.code = code
        self.detail = detail


class TeamsConnector:
    """Sends activities to conversations named by a conversation reference (JSON)."""

    def __init__(
        self,
        credentials: BotCredentials,
        *,
        request_timeout: float,
        clock: Callable[[], datetime],
    ) -> None:
        self.credentials = credentials
        self.request_timeout = request_timeout
        self.clock = clock
        self._clients: BoundedCache[str, Any] = BoundedCache(CONNECTOR_CLIENTS)
        self._exits = AsyncExitStack()

    async def post(
        self, reference: Mapping[str, Any], thread: str, activity: Activity
    ) -> str | None:
        """Send `activity` where the reference points (into reply chain `thread`, if any) and
        return its id (the connector answers some activities without one); raises
        `ConnectorError`."""
        ref = conversation_of(reference)
        base, root = split_conversation_id(str(ref.conversation.id))
        root = thread or root
        ref.conversation.id = f"{base}{REPLY_CHAIN_MARKER}{root}" if root else base
        activity = TurnContext.apply_conversation_reference(activity, ref)
        await self.credentials.refresh()
        conversations = self._client(str(ref.service_url)).conversations
        try:
            if activity.reply_to_id:
                result = await conversations.reply_to_activity(
                    ref.conversation.id, activity.reply_to_id, activity
                )
            else:
                result = await conversations.send_to_conversation(ref.conversation.id, activity)
        except HttpOperationError as exc:
            raise self._refusal(exc) from exc
        except (ClientRequestError, requests.RequestException, OSError) as exc:
            raise ConnectorError(f"Bot Connector unreachable: {exc}") from exc
        except ValueError as exc:  # msrest's DeserializationError: an answer that is no activity
            raise ConnectorError(f"the Bot Connector's answer could not be read: {exc}") from exc
        identifier = getattr(result, "id", None)
        return str(identifier) if identifier else None

    async def close(self) -> None:
        """Close every connector client opened (also those the cache has dropped since)."""
        await self._exits.aclose()
        self._clients.clear()

    def _client(self, service_url: str) -> Any:
        client = self._clients.get(service_url)
        if client is None:
            client = ConnectorClient(self.credentials, base_url=service_url)
            # The outbox owns retries (and honours Retry-After); the SDK would retry blindly.
            client.config.retry_policy.retries = 0
            client.config.connection.timeout = self.request_timeout
            # Closed at close() even if dropped from the cache before: a reply may still use it.
            self._exits.push_async_exit(client.__aexit__)
            self._clients.put(service_url, client)
        return client

    def _refusal(self, exc: HttpOperationError) -> ConnectorError:
        status = int(getattr(exc.response, "status_code", 0) or 0)
        headers = getattr(exc.response, "headers", None) or {}
        code, detail = _error_of(exc)
        message = f"Bot Connector answered HTTP {status}: {str(exc)[:200]}"  # (code) message
        if status == 401:
            self.credentials.invalidate()
        if status in _THROTTLED_STATUSES or status >= 500 or status == 0:
            return ConnectorError(
                message,
                status=status,
                code=code,
                detail=detail,
                retry_after=retry_after(headers.get("Retry-After"), self.clock()),
            )
        return ConnectorError(
            message,
            status=status,
            code=code,
            detail=detail,
            permanent=status in _PERMANENT_STATUSES,
        )


class ChatPace:
    """At most one request per `interval` seconds to each chat, counted from the end of the
    previous one (Teams wants the answer to a stream request before the next request).

    `request(chat)` reserves the chat's next free slot before its first await, so callers
    that come together queue one interval apart, and sleeps until the slot; when the request
    is over, the next slot moves to one interval after that. `monotonic` and `sleep` are the
    real clock unless a test drives time itself.
    """

    def __init__(
        self,
        interval: float = 1.0,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.interval = interval
        self.monotonic = monotonic
        self.sleep = sleep
        self._next: BoundedCache[str, float] = BoundedCache(PACED_CHATS)

    @asynccontextmanager
    async def request(self, chat: str) -> AsyncIterator[None]:
        """Wait for the chat's next slot, make the request in the block, release the slot."""
        now = self.monotonic()
        slot = max(now, self._next.get(chat, now))
        self._next.put(chat, slot + self.interval)
        if slot > now:
            await self.sleep(slot - now)
        try:
            yield
        finally:
            after = self.monotonic() + self.interval
            self._next.put(chat, max(self._next.get(chat, after), after))


def message_activity(text: str) -> Activity:
    """A plain reply: a `message` activity with Markdown text."""
    return Activity(type=ActivityTypes.message, text=text, text_format=TextFormatTypes.markdown)


def conversation_of(reference: Mapping[str, Any]) -> Any:
    """The SDK's `ConversationReference` from its JSON; `ConnectorError` (permanent) when it
    is unreadable or lacks the conversation or the service URL."""
    try:
        ref = ConversationReference.deserialize(dict(reference))
    except (ValueError, TypeError) as exc:  # msrest's DeserializationError is a ValueError
        raise ConnectorError("invalid Teams conversation reference", permanent=True) from exc
    if ref.conversation is None or not ref.conversation.id or not ref.service_url:
        raise ConnectorError("incomplete Teams conversation reference", permanent=True)
    return ref


def retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def _error_of(exc: HttpOperationError) -> tuple[str, str]:
    """The connector's error code and message (`{"error": {"code", "message"}}`), if any."""
    body = getattr(getattr(exc, "error", None), "error", None)
    code = getattr(body, "code", None)
    message = getattr(body, "message", None)
    return (str(code) if code else "", str(message) if message else "")
