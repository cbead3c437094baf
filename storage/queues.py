"""The durable queues: the inbox of accepted platform messages and the outbox of replies.

Every accepted message waits in `inbound_events` until its turn finished it, and every reply in
`outbound_messages` until a platform accepted it; these repositories are how the gateway
accepts, claims, finishes and marks them. Like `storage.repositories`, they hold no rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import InboundEvent, InboundStatus, OutboundMessage, OutboundStatus
from storage.repositories import dialect_insert


class InboxRepository:
    """The durable inbox of accepted platform messages."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def accept(
        self,
        channel_type: str,
        message_id: str,
        *,
        sender_key: str,
        message: dict[str, Any],
        raw_payload: dict[str, Any],
        at: datetime,
    ) -> int | None:
        """Insert the message; its row id, or None when (channel, message id) was seen before."""
        statement = (
            dialect_insert(self.session, InboundEvent)
            .values(
                channel_type=channel_type,
                message_id=message_id,
                sender_key=sender_key,
                status=InboundStatus.PENDING.value,
                received_at=at,
                message=message,
                raw_payload=raw_payload,
            )
            .on_conflict_do_nothing(index_elements=["channel_type", "message_id"])
            .returning(InboundEvent.id)
        )
        result = await self.session.execute(statement)
        return result.scalar_one_or_none()

    async def accept_many(self, events: Sequence[InboundEvent]) -> list[int | None]:
        """Insert new (not yet added) events with one multi-row statement, in the given order.

        For each event its row id, or None when its (channel, message id) was seen before: in
        the table, or earlier in `events`.
        """
        table = InboundEvent.__table__
        firsts: dict[tuple[str, str], InboundEvent] = {}
        for event in events:
            firsts.setdefault((event.channel_type, event.message_id), event)
        rows = [
            {
                "channel_type": event.channel_type,
                "message_id": event.message_id,
                "sender_key": event.sender_key,
                "status": InboundStatus.PENDING.value,
                "received_at": event.received_at,
                "message": event.message,
                "raw_payload": event.raw_payload,
            }
            for event in firsts.values()
        ]
        statement = (
            dialect_insert(self.session, table)
            .on_conflict_do_nothing(index_elements=["channel_type", "message_id"])
            .returning(table.c.id, table.c.channel_type, table.c.message_id)
        )
        # A list of rows is one INSERT … VALUES (…), (…) … RETURNING (SQLAlchemy's
        # "insertmanyvalues"), compiled once whatever the number of rows.
        result = await self.session.execute(statement, rows)
        ids = {(channel, message_id): row_id for row_id, channel, message_id in result}
        # pop: the first of several events with one key gets the id, the others None.
        return [ids.pop((event.channel_type, event.message_id), None) for event in events]

    async def get(self, event_id: int) -> InboundEvent | None:
        """The inbound event, or None."""
        return await self.session.get(InboundEvent, event_id)

    async def pending_senders(self, *, limit: int = 500) -> list[str]:
        """Senders with unfinished events, in the order of their oldest event."""
        result = await self.session.execute(
            select(InboundEvent.sender_key)
            .where(InboundEvent.status == InboundStatus.PENDING.value)
            .group_by(InboundEvent.sender_key)
            .order_by(func.min(InboundEvent.id))
            .limit(limit)
        )
        return list(result.scalars())

    async def pending_ids_of_sender(self, sender_key: str) -> list[int]:
        """Unfinished events of one sender, oldest first."""
        result = await self.session.execute(
            select(InboundEvent.id)
            .where(
                InboundEvent.sender_key == sender_key,
                InboundEvent.status == InboundStatus.PENDING.value,
            )
            .order_by(InboundEvent.id)
        )
        return list(result.scalars())

    async def next_pending(
        self, sender_keys: Sequence[str], *, limit: int = 1
    ) -> list[InboundEvent]:
        """The oldest unfinished events sent from any of these identities (one user's queue)."""
        result = await self.session.execute(
            select(InboundEvent)
            .where(
                InboundEvent.sender_key.in_(sender_keys),
                InboundEvent.status == InboundStatus.PENDING.value,
            )
            .order_by(InboundEvent.id)
            .limit(limit)
        )
        return list(result.scalars())

    async def mark_appended(
        self, event_id: int, *, seq: int, session_id: str, user_id: str
    ) -> bool:
        """Remember that the event's message is in the session at `seq` (so a retry after a
        crash does not append it again); False when the event is gone."""
        result = await self.session.execute(
            update(InboundEvent)
            .where(InboundEvent.id == event_id)
            .values(appended_seq=seq, session_id=session_id, user_id=user_id)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def finish(
        self, event_id: int, status: InboundStatus, *, at: datetime, error: str | None = None
    ) -> bool:
        """Mark a pending event finished; False when it was not pending (someone else won)."""
        result = await self.session.execute(
            update(InboundEvent)
            .where(InboundEvent.id == event_id, InboundEvent.status == InboundStatus.PENDING.value)
            .values(status=status.value, processed_at=at, error=error)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def record_failure(self, event_id: int, error: str) -> int:
        """Count a failed processing attempt; the number of attempts so far."""
        result = await self.session.execute(
            update(InboundEvent)
            .where(InboundEvent.id == event_id)
            .values(attempts=InboundEvent.attempts + 1, error=error)
            .returning(InboundEvent.attempts)
        )
        return int(result.scalar_one())


class OutboxRepository:
    """The durable outbox of replies."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def enqueue(
        self,
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
        delivered: bool = False,
        claimed_until: datetime | None = None,
    ) -> OutboundMessage:
        """Commit a reply for sending (the caller's transaction commits it); `delivered` for
        channels whose clients fetch replies themselves, where being stored is being sent;
        `claimed_until` for a reply the caller sends itself, as if claimed with that lease."""
        status, next_attempt_at = OutboundStatus.PENDING, at
        if delivered:
            status = OutboundStatus.DELIVERED
        elif claimed_until is not None:
            status, next_attempt_at = OutboundStatus.SENDING, claimed_until
        row = OutboundMessage(
            message_id=message_id,
            user_id=user_id,
            session_id=session_id,
            inbound_event_id=inbound_event_id,
            channel_type=channel_type,
            channel_id=channel_id,
            thread_id=thread_id,
            in_reply_to=in_reply_to,
            kind=kind,
            content=content,
            reply_context=reply_context or {},
            status=status.value,
            attempts=0,
            created_at=at,
            next_attempt_at=next_attempt_at,
            delivered_at=at if delivered else None,
            platform_message_id=message_id if delivered else None,
        )
        self.session.add(row)
        await self.session.flush()
        return row

    async def claim_due(
        self, now: datetime, *, lease: timedelta, limit: int = 50
    ) -> list[OutboundMessage]:
        """Take replies whose attempt is due (or whose sender's lease ran out) for sending.

        Claimed rows get status `sending` and a lease; a process that dies mid-send leaves them
        to be claimed again when the lease ends. Rows locked by another claimer are skipped.
        """
        due = (
            select(OutboundMessage.id)
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
        ids = list((await self.session.execute(due)).scalars())
        if not ids:
            return []
        await self.session.execute(
            update(OutboundMessage)
            .where(OutboundMessage.id.in_(ids))
            .values(status=OutboundStatus.SENDING.value, next_attempt_at=now + lease)
        )
        result = await self.session.execute(
            select(OutboundMessage).where(OutboundMessage.id.in_(ids)).order_by(OutboundMessage.id)
        )
        return list(result.scalars())

    async def mark_delivered(
        self, outbound_id: int, *, platform_message_id: str | None, at: datetime
    ) -> None:
        """The platform accepted the reply."""
        await self.mark_delivered_many({outbound_id: platform_message_id}, at=at)

    async def mark_delivered_many(
        self, platform_message_ids: dict[int, str | None], *, at: datetime
    ) -> None:
        """The platform accepted these replies (outbound row id → the platform's message id):
        one UPDATE for all of them."""
        if not platform_message_ids:
            return
        await self.session.execute(
            update(OutboundMessage)
            .where(OutboundMessage.id.in_(list(platform_message_ids)))
            .values(
                status=OutboundStatus.DELIVERED.value,
                platform_message_id=case(platform_message_ids, value=OutboundMessage.id),
                delivered_at=at,
                attempts=OutboundMessage.attempts + 1,
                last_error=None,
            )
        )

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
    ) -> list[OutboundMessage]:
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
        return list(result.scalars())

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
