"""The outbox sender: delivers committed replies through their channel adapter.

Replies are claimed with a lease (so two processes never send one reply at the same time, and
one that dies mid-send leaves it to be claimed again), sent, and marked delivered with the
platform's message id. A failed send is retried with exponential backoff and full jitter, or
after the platform's own `Retry-After`, up to `max_attempts`; then it is marked failed and
logged.

Delivery marks that fall together share one transaction (`storage.group_commit`). A send
finishes only once its mark is committed, and an idle sender commits a mark at once, so the
window in which a crash leaves a sent reply unmarked grows by at most the one transaction the
mark may wait for. The lease then brings such a reply back marked `resumed`: a channel that can
ask the platform what it already holds of the reply (Slack) sends only what is missing; the
others send it again.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from channels.base import ChannelType, FileToSend, OutboundMessage
from channels.plugin import ChannelAdapter
from errors import DeliveryError, GatewayError
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from storage.database import Database
from storage.group_commit import GroupCommit, refused_for_its_content
from storage.repositories.outbox import OutboxRepository, QueuedReply, mark_delivered

log = get_logger(__name__)

CLAIM_BATCH = 50
MARK_BATCH = 256  # delivery marks per transaction at most


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a reply is retried."""

    max_attempts: int = 8
    base_delay: float = 1.0
    max_delay: float = 300.0
    lease: timedelta = timedelta(seconds=120)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds before attempt `attempt + 1`: the platform's hint, else jittered backoff."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        ceiling = min(self.max_delay, self.base_delay * 2 ** max(attempt - 1, 0))
        return random.uniform(ceiling / 2, ceiling)  # noqa: S311 (jitter, not security)


@dataclass(frozen=True, slots=True)
class Delivered:
    """A reply the platform accepted, to be marked delivered."""

    outbound_id: int
    platform_message_id: str | None


class OutboxSender:
    """Sends due replies, concurrently across replies, until stopped."""

    def __init__(
        self,
        database: Database,
        adapters: Mapping[ChannelType, ChannelAdapter],
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], datetime],
        policy: RetryPolicy | None = None,
        poll_interval: float = 1.0,
        concurrency: int = 16,
    ) -> None:
        self.database = database
        self.adapters = adapters
        self.metrics = metrics
        self.clock = clock
        self.policy = policy or RetryPolicy()
        self.poll_interval = poll_interval
        self._slots = asyncio.Semaphore(concurrency)
        self._wake = asyncio.Event()
        self._stopping = False
        self._sending: set[asyncio.Task[None]] = set()
        self._marks: GroupCommit[Delivered, None] = GroupCommit(
            self._mark_delivered, max_batch=MARK_BATCH, split_on=refused_for_its_content
        )

    def send_now(self, row: QueuedReply) -> None:
        """Send a reply this process committed already claimed (status `sending`, leased)."""
        task = asyncio.create_task(self._send_claimed(row), name=f"send:{row.message_id}")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def run(self) -> None:
        """Send until `stop()`, then wait for the sends in flight."""
        try:
            await self._claim_until_stopped()
        finally:
            if self._sending:
                await asyncio.gather(*set(self._sending), return_exceptions=True)
            await self._marks.drained()

    async def _claim_until_stopped(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                claimed = await self.send_due()
            except (GatewayError, OSError) as exc:
                log.error("outbox.claim_failed", error=str(exc).splitlines()[0])
                claimed = 0
            if claimed >= CLAIM_BATCH:
                continue  # a full batch: more may be due right away
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_interval)

    def stop(self) -> None:
        """Stop claiming after the sends in flight (`run` returns once they finish)."""
        self._stopping = True
        self._wake.set()

    async def send_due(self) -> int:
        """Claim the due replies and start sending them; how many were claimed."""
        async with self.database.session() as db:
            rows = await OutboxRepository(db).claim_due(
                self.clock(), lease=self.policy.lease, limit=CLAIM_BATCH
            )
        results = await asyncio.gather(
            *(self._send(claimed.reply, resumed=claimed.resumed) for claimed in rows),
            return_exceptions=True,
        )
        for claimed, result in zip(rows, results, strict=True):
            if isinstance(result, BaseException):
                # The lease brings the row back; the error must not stop the other sends.
                log.error(
                    "outbox.send_crashed", message_id=claimed.reply.message_id, error=repr(result)
                )
        return len(rows)

    async def _send_claimed(self, row: QueuedReply) -> None:
        try:
            await self._send(row)
        except Exception as exc:  # noqa: BLE001
            # The lease brings the row back to the claiming loop.
            log.error("outbox.send_crashed", message_id=row.message_id, error=repr(exc))

    async def _send(self, row: QueuedReply, *, resumed: bool = False) -> None:
        channel = ChannelType(row.channel_type)
        adapter = self.adapters.get(channel)
        if adapter is None:
            not_enabled = DeliveryError(f"the {channel} channel is not enabled", permanent=True)
            await self._failed(row, not_enabled)
            return
        try:
            # The slot bounds the calls to platforms only: a reply waiting for its delivery
            # mark does not keep another from being sent.
            async with self._slots:
                receipt = await adapter.send(_outbound(row, resumed=resumed))
        except DeliveryError as exc:
            await self._failed(row, exc)
            return
        except Exception as exc:
            # An adapter bug or an error it did not translate: counted as a failed attempt
            # like any other, so the reply is retried and, in the end, given up with a log line.
            log.exception(
                "outbox.adapter_crashed", channel=channel.value, message_id=row.message_id
            )
            await self._failed(row, DeliveryError(f"{type(exc).__name__}: {exc}"))
            return
        await self._marks.submit(Delivered(row.id, receipt.platform_message_id))
        self.metrics.messages_out.labels(channel.value, "delivered").inc()
        log.info(
            "outbox.delivered",
            channel=channel.value,
            message_id=row.message_id,
            in_reply_to=row.in_reply_to,
            attempts=row.attempts + 1,
            resumed=resumed,
        )

    async def _mark_delivered(self, marks: list[Delivered]) -> list[None]:
        async with self.database.statement(writes=True) as scope:  # one UPDATE for the batch
            await mark_delivered(
                scope,
                {mark.outbound_id: mark.platform_message_id for mark in marks},
                at=self.clock(),
            )
        return [None] * len(marks)

    async def _failed(self, row: QueuedReply, exc: DeliveryError) -> None:
        attempt = row.attempts + 1
        give_up = exc.permanent or attempt >= self.policy.max_attempts
        retry_at = None
        if not give_up:
            retry_at = self.clock() + timedelta(seconds=self.policy.delay(attempt, exc.retry_after))
        async with self.database.session() as db:
            await OutboxRepository(db).mark_attempt_failed(
                row.id, error=str(exc), retry_at=retry_at
            )
        outcome = "failed" if give_up else "retry"
        self.metrics.messages_out.labels(row.channel_type, outcome).inc()
        event = "outbox.delivery_failed" if give_up else "outbox.retry_scheduled"
        log.warning(
            event,
            channel=row.channel_type,
            message_id=row.message_id,
            attempt=attempt,
            error=str(exc),
            retry_at=retry_at.isoformat() if retry_at else None,
        )


def _outbound(row: QueuedReply, *, resumed: bool) -> OutboundMessage:
    attached = row.attachment
    return OutboundMessage(
        message_id=row.message_id,
        channel_type=ChannelType(row.channel_type),
        channel_id=row.channel_id,
        content=row.content,
        user_id=row.user_id,
        thread_id=row.thread_id,
        in_reply_to=row.in_reply_to,
        reply_context=dict(row.reply_context),
        file=FileToSend(**attached) if isinstance(attached, dict) else None,
        resumed=resumed,
    )


class OutboxFeed:
    """The web channel's reply feed, read from the outbox."""

    def __init__(self, database: Database) -> None:
        self.database = database

    async def replies(
        self, user_id: str, *, after: int, limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        """Replies to a web user after the cursor (an outbound row id), oldest first."""
        async with self.database.single() as db:
            rows = await OutboxRepository(db).feed(
                ChannelType.WEB.value, user_id, after_id=after, limit=limit
            )
        messages = [feed_item(row, user_id) for row in rows]
        return messages, (rows[-1].id if rows else after)


def feed_item(row: QueuedReply, user_id: str) -> dict[str, Any]:
    """A reply as the web feed shows it (the client's own id of the message it answers)."""
    return {
        "message_id": row.message_id,
        "role": "assistant",
        "text": row.content,
        "session_id": row.session_id,
        "thread_id": row.thread_id or None,
        "in_reply_to": (row.in_reply_to or "").removeprefix(f"{user_id}:") or None,
        "created_at": row.created_at.isoformat(),
    }


class SentReplies:
    """The email channel's view of our own replies: their texts, by our or the platform's id
    (so quoted copies of them can be cut from answers)."""

    def __init__(self, database: Database, channel_type: ChannelType) -> None:
        self.database = database
        self.channel_type = channel_type

    async def texts(self, message_ids: Sequence[str]) -> list[str]:
        """The texts of our replies with these ids (`message_id` or `platform_message_id`)."""
        if not message_ids:
            return []
        async with self.database.single() as db:
            return await OutboxRepository(db).texts_of(self.channel_type.value, message_ids)
