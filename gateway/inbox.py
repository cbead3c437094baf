"""The durable inbox: every accepted message is committed before its platform hears back.

A message whose (channel, message id) was seen before is a duplicate (a platform retry) and is
dropped with a log line; everything else waits in `inbound_events` until the dispatcher has
answered it, so a crash after the acknowledgement loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from channels.base import AcceptResult, ChannelMessage
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from storage.database import Database
from storage.errors import StorageError
from storage.repositories import InboxRepository

log = get_logger(__name__)


def sender_key(channel_type: str, user_identifier: str) -> str:
    """The key that ties an event to its sender's identity (and so to one user's queue)."""
    return f"{channel_type}:{normalise_identifier(channel_type, user_identifier)}"


def normalise_identifier(channel_type: str, user_identifier: str) -> str:
    """External ids as stored: email addresses compare case-insensitively, others exactly."""
    return user_identifier.strip().lower() if channel_type == "email" else user_identifier.strip()


class Inbox:
    """Accepts normalised messages from every channel adapter."""

    def __init__(
        self,
        database: Database,
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], datetime],
        on_accept: Callable[[str], None],
    ) -> None:
        self.database = database
        self.metrics = metrics
        self.clock = clock
        self.on_accept = on_accept

    async def accept(self, message: ChannelMessage) -> AcceptResult:
        """Commit the message (or recognise a duplicate); raises `StorageError` on failure.

        Adapters acknowledge the platform only after this returns, and answer with an error
        (so the platform retries) when it raises.
        """
        channel = message.channel_type.value
        sender = sender_key(channel, message.user_identifier)
        try:
            async with self.database.session() as session:
                event_id = await InboxRepository(session).accept(
                    channel,
                    message.message_id,
                    sender_key=sender,
                    message=message.to_record(),
                    raw_payload=dict(message.raw),
                    at=self.clock(),
                )
        except SQLAlchemyError as exc:
            log.error(
                "inbox.accept_failed",
                channel=channel,
                message_id=message.message_id,
                error=str(exc).splitlines()[0],
            )
            raise StorageError(f"could not store the inbound message: {exc}") from exc
        if event_id is None:
            self.metrics.duplicates_dropped.labels(channel).inc()
            log.info("inbox.duplicate_dropped", channel=channel, message_id=message.message_id)
            return AcceptResult(accepted=False, message_id=message.message_id)
        self.metrics.messages_in.labels(channel).inc()
        log.info(
            "inbox.accepted", channel=channel, message_id=message.message_id, event_id=event_id
        )
        self.on_accept(sender)
        return AcceptResult(accepted=True, message_id=message.message_id)
