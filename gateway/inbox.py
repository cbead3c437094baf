"""The durable inbox: every accepted message is committed before its platform hears back.

A message whose (channel, message id) was seen before is a duplicate (a platform retry) and is
dropped with a log line; everything else waits in `inbound_events` until the dispatcher has
answered it, so a crash after the acknowledgement loses nothing.

Messages that arrive together are committed together (`storage.group_commit`): one
transaction, one multi-row INSERT, for whatever arrived while the previous one ran. Each caller
still returns only after its own row is committed, and a batch that fails fails every caller
in it, so each platform retries; a batch the database refused for the values in one message is
retried message by message, so that message fails alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from channels.base import AcceptResult, ChannelMessage
from errors import StorageError
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from storage.database import Database
from storage.group_commit import GroupCommit, refused_for_its_content
from storage.repositories.inbox import MAX_ACCEPT_BATCH, NewInboundEvent, accept_events

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
        on_accept: Callable[[str], None] | None,
        on_arrival: Callable[[int, str, dict[str, Any]], None] | None = None,
        workers: int = 1,
    ) -> None:
        self.database = database
        self.metrics = metrics
        self.clock = clock
        # Told the sender of each new message once committed, to schedule its turn in this
        # process; None when the turns run in other processes (turn workers, PostgreSQL):
        # the INSERT then announces the senders to them itself (`storage.inbox_signal`).
        if on_accept is None and database.is_sqlite:
            raise ValueError("announcing new messages to other processes needs PostgreSQL")
        self.on_accept = on_accept
        # The turn workers the INSERT announces new messages' senders to (without `on_accept`).
        self.announce_to = 0 if on_accept is not None else max(workers, 1)
        # Told (event id, sender key, message record) of each new message once committed,
        # before `on_accept` schedules its turn, for what can be shown at once (the status).
        self.on_arrival = on_arrival
        self._arrivals: GroupCommit[NewInboundEvent, int | None] = GroupCommit(
            self._store, max_batch=MAX_ACCEPT_BATCH, split_on=refused_for_its_content
        )

    async def accept(self, message: ChannelMessage) -> AcceptResult:
        """Commit the message (or recognise a duplicate); raises `StorageError` on failure.

        Adapters acknowledge the platform only after this returns, and answer with an error
        (so the platform retries) when it raises.
        """
        channel = message.channel_type.value
        record, raw = storable(message.to_record()), storable(dict(message.raw))
        event = NewInboundEvent(
            channel_type=channel,
            message_id=record["message_id"],
            sender_key=sender_key(channel, record["user_identifier"]),
            received_at=self.clock(),
            message=record,
            raw_payload=raw,
        )
        try:
            event_id = await self._arrivals.submit(event)
        except StorageError as exc:
            log.error(
                "inbox.accept_failed",
                channel=channel,
                message_id=event.message_id,
                error=str(exc).splitlines()[0],
            )
            raise StorageError(f"could not store the inbound message: {exc}") from exc
        return AcceptResult(accepted=event_id is not None, message_id=message.message_id)

    async def _store(self, events: list[NewInboundEvent]) -> list[int | None]:
        # One multi-row INSERT: committed by itself before anyone is acknowledged.
        async with self.database.statement(writes=True, accepting=True) as scope:
            event_ids = await accept_events(scope, events, announce=self.announce_to)
        # Committed: counted, logged and handed to the dispatcher here rather than by each
        # caller, so a caller that went away (a closed request) cannot hide its message.
        for event, event_id in zip(events, event_ids, strict=True):
            if event_id is None:
                self.metrics.duplicates_dropped.labels(event.channel_type).inc()
                log.info(
                    "inbox.duplicate_dropped",
                    channel=event.channel_type,
                    message_id=event.message_id,
                )
            else:
                self.metrics.messages_in.labels(event.channel_type).inc()
                log.info(
                    "inbox.accepted",
                    channel=event.channel_type,
                    message_id=event.message_id,
                    event_id=event_id,
                )
                if self.on_arrival is not None:
                    self.on_arrival(event_id, event.sender_key, event.message)
                if self.on_accept is not None:
                    self.on_accept(event.sender_key)
        return event_ids


def storable(value: Any) -> Any:
    """`value` as it can be stored: a lone UTF-16 surrogate (JSON's "\\ud800", which no
    UTF-8 text can hold) is replaced, here once, instead of failing every later write."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return scrubbed(value)
    return value


def scrubbed(value: Any) -> Any:
    """`value` with every string made encodable as UTF-8 (lone surrogates become '?')."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {scrubbed(key): scrubbed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [scrubbed(item) for item in value]
    return value
