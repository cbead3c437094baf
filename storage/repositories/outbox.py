"""The outbox: every reply waits in `outbound_messages` until a platform accepted it; this is
how the gateway enqueues, claims and marks them."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from storage import driver_rows
from storage.models import OutboundMessage, OutboundStatus


@dataclass(frozen=True, slots=True)
class QueuedReply:
    """A reply as stored in the outbox: what its sender and the web feed need of it."""

    id: int
    message_id: str
    channel_type: str
    channel_id: str
    thread_id: str
    content: str
    user_id: str | None
    session_id: str | None
    in_reply_to: str | None
    kind: str
    reply_context: Mapping[str, Any]
    attachment: Mapping[str, Any] | None
    attempts: int
    created_at: datetime

    @classmethod
    def of(cls, row: OutboundMessage) -> QueuedReply:
        """The value of a row the ORM read."""
        return cls(
            id=row.id,
            message_id=row.message_id,
            channel_type=row.channel_type,
            channel_id=row.channel_id,
            thread_id=row.thread_id,
            content=row.content,
            user_id=row.user_id,
            session_id=row.session_id,
            in_reply_to=row.in_reply_to,
            kind=row.kind,
            reply_context=row.reply_context,
            attachment=row.attachment,
            attempts=row.attempts,
            created_at=row.created_at,
        )


@dataclass(frozen=True, slots=True)
class ClaimedReply:
    """A reply claimed for sending; `resumed` when it was claimed from a sender whose lease
    ran out (it died mid-send, perhaps after the platform took the reply)."""

    reply: QueuedReply
    resumed: bool


_ENQUEUED = (
    "message_id",
    "user_id",
    "session_id",
    "inbound_event_id",
    "channel_type",
    "channel_id",
    "thread_id",
    "in_reply_to",
    "kind",
    "content",
    "reply_context",
    "attachment",
    "status",
    "attempts",
    "created_at",
    "next_attempt_at",
    "delivered_at",
    "platform_message_id",
)
ENQUEUE = (
    f"INSERT INTO outbound_messages ({', '.join(_ENQUEUED)}) "  # noqa: S608 (names only)
    f"VALUES ({', '.join(':' + column for column in _ENQUEUED)}) RETURNING id"
)


@functools.lru_cache(maxsize=64)
def _mark_delivered(count: int) -> str:
    """One UPDATE marking `count` replies delivered, each with its platform message id."""
    ids = ", ".join(f":id_{n}" for n in range(count))
    platform_ids = " ".join(f"WHEN :id_{n} THEN :platform_id_{n}" for n in range(count))
    return (
        "UPDATE outbound_messages SET status = 'delivered', "  # noqa: S608 (placeholders only)
        f"platform_message_id = CASE id {platform_ids} END, delivered_at = :at, "
        f"attempts = attempts + 1, last_error = NULL WHERE id IN ({ids})"
    )


@dataclass(frozen=True, slots=True)
class SentReply:
    """A reply `send_enqueue` stored; `value` is the row, with its id."""

    sent: driver_rows.Sent
    reply: QueuedReply  # its id not known yet

    async def value(self) -> QueuedReply:
        """The stored reply (in a pipeline, once the answer is in: waiting for it if not)."""
        ((row_id,),) = await self.sent.rows()
        return replace(self.reply, id=row_id)


@dataclass(frozen=True, slots=True)
class ReplyRow:
    """A reply's outbox row before it is stored: its columns (`ENQUEUE`'s parameters), and
    the reply as `SentReply.value` gives it back, less the id the INSERT hands out."""

    values: Mapping[str, Any]
    reply: QueuedReply


def reply_row(
    *,
    message_id: str,
    channel_type: str,
    channel_id: str,
    content: str,
    at: datetime,
    thread_id: str = "",
    in_reply_to: str | None = None,
    kind: str = "reply",
    user_id: str | None = None,
    session_id: str | None = None,
    inbound_event_id: int | None = None,
    reply_context: dict[str, Any] | None = None,
    attachment: dict[str, Any] | None = None,
    delivered: bool = False,
    claimed_until: datetime | None = None,
) -> ReplyRow:
    """The outbox row of a reply: `delivered` for channels whose clients fetch replies
    themselves, where being stored is being sent; `claimed_until` for a reply the caller
    sends itself, as if claimed with that lease."""
    status, next_attempt_at = OutboundStatus.PENDING, at
    if delivered:
        status = OutboundStatus.DELIVERED
    elif claimed_until is not None:
        status, next_attempt_at = OutboundStatus.SENDING, claimed_until
    reply_context = reply_context or {}
    values: dict[str, Any] = {
        "message_id": message_id,
        "user_id": user_id,
        "session_id": session_id,
        "inbound_event_id": inbound_event_id,
        "channel_type": channel_type,
        "channel_id": channel_id,
        "thread_id": thread_id,
        "in_reply_to": in_reply_to,
        "kind": kind,
        "content": content,
        "reply_context": driver_rows.JsonValue(reply_context),
        "attachment": driver_rows.JsonValue(attachment) if attachment is not None else None,
        "status": status.value,
        "attempts": 0,
        "created_at": at,
        "next_attempt_at": next_attempt_at,
        "delivered_at": at if delivered else None,
        "platform_message_id": message_id if delivered else None,
    }
    return ReplyRow(
        values,
        QueuedReply(
            id=0,
            message_id=message_id,
            channel_type=channel_type,
            channel_id=channel_id,
            thread_id=thread_id,
            content=content,
            user_id=user_id,
            session_id=session_id,
            in_reply_to=in_reply_to,
            kind=kind,
            reply_context=reply_context,
            attachment=attachment,
            attempts=0,
            created_at=at,
        ),
    )


async def send_enqueue(scope: driver_rows.DriverScope, row: ReplyRow) -> SentReply:
    """Commit a reply's row (`reply_row`) for sending; the scope's transaction commits it.
    In a `driver_rows.pipelined` block the INSERT is queued: the row with its id comes
    through `SentReply.value`."""
    sent = await driver_rows.send(scope, ENQUEUE, row.values)
    return SentReply(sent, row.reply)


class OutboxRepository:
    """The durable outbox of replies."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def enqueue(self, **reply: Any) -> QueuedReply:
        """Commit a reply for sending, with the arguments of `reply_row`; the row, waited
        for."""
        return await (await send_enqueue(self.session, reply_row(**reply))).value()

    async def claim_due(
        self, now: datetime, *, lease: timedelta, limit: int = 50
    ) -> list[ClaimedReply]:
        """Take replies whose attempt is due (or whose sender's lease ran out) for sending.

        Claimed rows get status `sending` and a lease; a process that dies mid-send leaves them
        to be claimed again when the lease ends (`ClaimedReply.resumed`). Rows locked by
        another claimer are skipped.
        """
        due = (
            select(OutboundMessage.id, OutboundMessage.status)
            .where(
                OutboundMessage.status.in_(
                    [OutboundStatus.PENDING.value, OutboundStatus.SENDING.value]
                ),
                OutboundMessage.next_attempt_at <= now,
            )
            .order_by(OutboundMessage.next_attempt_at, OutboundMessage.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        found = {row_id: status for row_id, status in await self.session.execute(due)}
        if not found:
            return []
        ids = list(found)
        await self.session.execute(
            update(OutboundMessage)
            .where(OutboundMessage.id.in_(ids))
            .values(status=OutboundStatus.SENDING.value, next_attempt_at=now + lease)
        )
        result = await self.session.execute(
            select(OutboundMessage).where(OutboundMessage.id.in_(ids)).order_by(OutboundMessage.id)
        )
        return [
            ClaimedReply(QueuedReply.of(row), resumed=found[row.id] == OutboundStatus.SENDING.value)
            for row in result.scalars()
        ]

    async def mark_attempt_failed(
        self, outbound_id: int, *, error: str, retry_at: datetime | None
    ) -> None:
        """A send failed: schedule the retry at `retry_at`, or give up when it is None."""
        values: dict[str, Any] = {
            "attempts": OutboundMessage.attempts + 1,
            "last_error": error,
        }
        if retry_at is None:
            values["status"] = OutboundStatus.FAILED.value
        else:
            values.update(status=OutboundStatus.PENDING.value, next_attempt_at=retry_at)
        await self.session.execute(
            update(OutboundMessage).where(OutboundMessage.id == outbound_id).values(values)
        )

    async def feed(
        self, channel_type: str, channel_id: str, *, after_id: int = 0, limit: int = 100
    ) -> list[QueuedReply]:
        """Replies on one channel address after a cursor (the outbound row id), oldest first."""
        result = await self.session.execute(
            select(OutboundMessage)
            .where(
                OutboundMessage.channel_type == channel_type,
                OutboundMessage.channel_id == channel_id,
                OutboundMessage.id > after_id,
            )
            .order_by(OutboundMessage.id)
            .limit(limit)
        )
        return [QueuedReply.of(row) for row in result.scalars()]

    async def latest(self, channel_type: str, channel_id: str, *, limit: int) -> list[QueuedReply]:
        """The newest replies on one channel address, newest first (a page shown again)."""
        result = await self.session.execute(
            select(OutboundMessage)
            .where(
                OutboundMessage.channel_type == channel_type,
                OutboundMessage.channel_id == channel_id,
            )
            .order_by(OutboundMessage.id.desc())
            .limit(limit)
        )
        return [QueuedReply.of(row) for row in result.scalars()]

    async def sent_since(
        self, channel_type: str, channel_id: str, kind: str, since: datetime
    ) -> bool:
        """Whether a message of `kind` went to this address since `since` (rate limits)."""
        result = await self.session.execute(
            select(OutboundMessage.id)
            .where(
                OutboundMessage.channel_type == channel_type,
                OutboundMessage.channel_id == channel_id,
                OutboundMessage.kind == kind,
                OutboundMessage.created_at >= since,
            )
            .limit(1)
        )
        return result.scalar_one_or_none() is not None

    async def session_of_message(self, message_ids: Sequence[str]) -> str | None:
        """The session of the newest reply sent with one of these ids (ours or the platform's)."""
        if not message_ids:
            return None
        result = await self.session.execute(
            select(OutboundMessage.session_id)
            .where(
                OutboundMessage.session_id.is_not(None),
                (OutboundMessage.message_id.in_(message_ids))
                | (OutboundMessage.platform_message_id.in_(message_ids)),
            )
            .order_by(OutboundMessage.id.desc())
            .limit(1)
        )
        return result.scalar_one_or_none()

    async def texts_of(self, channel_type: str, message_ids: Sequence[str]) -> list[str]:
        """The texts of the channel's replies sent with these ids (ours or the platform's)."""
        result = await self.session.execute(
            select(OutboundMessage.content).where(
                OutboundMessage.channel_type == channel_type,
                (OutboundMessage.message_id.in_(message_ids))
                | (OutboundMessage.platform_message_id.in_(message_ids)),
            )
        )
        return list(result.scalars())

    async def backlog(self) -> int:
        """How many replies wait to be sent."""
        result = await self.session.execute(
            select(func.count()).where(
                OutboundMessage.status.in_(
                    [OutboundStatus.PENDING.value, OutboundStatus.SENDING.value]
                )
            )
        )
        return int(result.scalar_one())


async def mark_delivered(
    scope: driver_rows.DriverScope, platform_message_ids: dict[int, str | None], *, at: datetime
) -> None:
    """The platform accepted these replies (outbound row id → the platform's message id):
    one UPDATE for all of them, through the driver (`storage.driver_rows`)."""
    if not platform_message_ids:
        return
    ids = list(platform_message_ids)
    params: dict[str, Any] = {"at": at}
    for n, outbound_id in enumerate(ids):
        params[f"id_{n}"] = outbound_id
        params[f"platform_id_{n}"] = platform_message_ids[outbound_id]
    await driver_rows.rows(scope, _mark_delivered(len(ids)), params)
