"""The inbox: every accepted platform message waits in `inbound_events` until its turn
finished it; this is how the gateway accepts, claims and finishes them."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, literal_column, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from storage import driver_rows
from storage.inbox_signal import CHANNEL as INBOX_CHANNEL
from storage.inbox_signal import WorkerShare, share_of
from storage.models import InboundEvent, InboundStatus
from storage.repositories._sql import dialect_insert

MAX_ACCEPT_BATCH = 128
"""Events per `accept_events` statement (and so per inbox transaction) at most: a few hundred kB
of payloads in one statement, whose text is cached for each number of rows."""

ANNOUNCED_BYTES = 6000
"""How a notification of `accept_events(announce=True)` is filled: each sender key goes to
the notification its offset (the bytes of the keys and newlines before it) falls in, a
notification per `ANNOUNCED_BYTES`. A notification then holds less than that plus one key;
a key is at most 400 characters of at most four bytes (1,600), so every one stays under
PostgreSQL's payload limit of 8,000 bytes, whatever the script of the addresses."""


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """An unfinished event as a user's queue shows it: the accepted message (its record) and
    the live platform message an earlier attempt streamed into, if any."""

    id: int
    message: dict[str, Any]
    live_reply: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class NewInboundEvent:
    """An accepted platform message, to be stored pending: its channel and the platform's
    message id (unique together: a repeat is a duplicate), the sender's key, and the
    normalised message and the platform's payload as stored."""

    channel_type: str
    message_id: str
    sender_key: str
    received_at: datetime
    message: dict[str, Any]
    raw_payload: dict[str, Any]


def _pending(row: Sequence[Any]) -> PendingEvent:
    return PendingEvent(
        id=row[0],
        message=driver_rows.json_value(row[1]),
        live_reply=driver_rows.json_value(row[2]) or None,
    )


_ACCEPTED = ("channel_type", "message_id", "sender_key", "received_at", "message", "raw_payload")
_QUEUED = "SELECT id, message, live_reply FROM inbound_events WHERE id = :id"


@functools.lru_cache(maxsize=2 * MAX_ACCEPT_BATCH)
def _accept_many(count: int, *, announce: int) -> str:
    # status and attempts as the model's defaults would set them.
    insert = (
        "INSERT INTO inbound_events "  # noqa: S608 (placeholders only)
        f"({', '.join(_ACCEPTED)}, status, attempts) VALUES "
        + ", ".join(
            "(" + ", ".join(f":{name}_{row}" for name in _ACCEPTED) + ", 'pending', 0)"
            for row in range(count)
        )
        + " ON CONFLICT (channel_type, message_id) DO NOTHING"
        " RETURNING id, channel_type, message_id, sender_key"
    )
    if not announce:
        return insert
    # The senders of the new rows (not the duplicates), oldest first, each on its worker's
    # channel, in notifications of about `ANNOUNCED_BYTES`; PostgreSQL sends them when the
    # statement commits. The count keeps the CTE that notifies in the plan (only referenced
    # CTEs run), evaluated once.
    return f"""
WITH accepted AS ({insert}),
senders AS (
    SELECT sender_key, min(id) AS first, {share_of("sender_key", announce)} AS share
    FROM accepted GROUP BY sender_key
),
parts AS (
    SELECT sender_key, first, share,
           (sum(octet_length(sender_key) + 1) OVER (PARTITION BY share ORDER BY first)
            - octet_length(sender_key) - 1) / {ANNOUNCED_BYTES} AS part
    FROM senders
),
announced AS (
    SELECT pg_notify('{INBOX_CHANNEL}_' || share, string_agg(sender_key, E'\\n' ORDER BY first))
    FROM parts GROUP BY share, part
)
SELECT accepted.*, (SELECT count(*) FROM announced) AS notifications FROM accepted
"""  # noqa: S608 (our constants and placeholders only)


@functools.lru_cache(maxsize=16)
def _next_pending(keys: int) -> str:
    """The oldest `:limit` pending events of `keys` sender keys (`:key_0` …): for each key its
    own oldest, read by (sender_key, id) over the pending events (migration 0011), then the
    oldest of those. As one `sender_key IN (…) ORDER BY id`, the plan PostgreSQL prepared
    while the table's statistics were off walked every sender's pending events in queue order
    through (status, id) and filtered them (525 rows read a message in a 10,000-user
    `bench/e2e.py` run with a backlog): a read that cost what the whole backlog cost."""
    columns = "SELECT id, message, live_reply FROM inbound_events"
    one = [
        f"{columns} WHERE sender_key = :key_{i} AND status = 'pending' ORDER BY id LIMIT :limit"
        for i in range(keys)
    ]
    if keys == 1:
        return one[0]
    # Each branch a subquery: SQLite takes no parenthesised SELECT in a compound one.
    branches = " UNION ALL ".join(
        f"SELECT * FROM ({branch}) AS key_{i}"  # noqa: S608 (placeholders only)
        for i, branch in enumerate(one)
    )
    return f"SELECT * FROM ({branches}) AS queue ORDER BY id LIMIT :limit"  # noqa: S608


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

    async def queued(self, event_id: int) -> PendingEvent | None:
        """The event as a user's queue shows it (whatever its status), or None."""
        found = await driver_rows.rows(self.session, _QUEUED, {"id": event_id})
        return _pending(found[0]) if found else None

    async def pending_senders(
        self, *, limit: int = 500, share: WorkerShare | None = None, before: datetime | None = None
    ) -> list[str]:
        """Senders with unfinished events, in the order of their oldest event; with `share`,
        only the worker's own and those whose oldest pending event arrived before `before`
        (`storage.inbox_signal.TAKEOVER_AFTER`)."""
        oldest = func.min(InboundEvent.id)
        statement = (
            select(InboundEvent.sender_key)
            .where(InboundEvent.status == InboundStatus.PENDING.value)
            .group_by(InboundEvent.sender_key)
            .order_by(oldest)
            .limit(limit)
        )
        if share is not None and share.count > 1:
            own = literal_column(share_of("inbound_events.sender_key", share.count)) == share.index
            waited = func.min(InboundEvent.received_at) < before if before is not None else None
            statement = statement.having(own if waited is None else or_(own, waited))
        result = await self.session.execute(statement)
        return list(result.scalars())

    async def pending_attachments(self) -> list[list[dict[str, Any]]]:
        """The attachments of every unfinished event that has any (the stash sweep keeps
        what they name). Not limited: leaving one out would delete a file still waited for."""
        result = await self.session.execute(
            select(InboundEvent.message["attachments"]).where(
                InboundEvent.status == InboundStatus.PENDING.value
            )
        )
        return [list(found) for found in result.scalars() if found]

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

    async def record_live_reply(self, event_id: int, handle: dict[str, Any]) -> bool:
        """Remember the platform message a pending event's answer is being streamed into (a
        restarted turn finishes it instead of posting another); False when the event is
        finished or gone."""
        result = await self.session.execute(
            update(InboundEvent)
            .where(InboundEvent.id == event_id, InboundEvent.status == InboundStatus.PENDING.value)
            .values(live_reply=handle)
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


async def accept_events(
    scope: driver_rows.DriverScope, events: Sequence[NewInboundEvent], *, announce: int = 0
) -> list[int | None]:
    """Insert new events with one multi-row statement, in the given order.

    For each event its row id, or None when its (channel, message id) was seen before: in
    the table, or earlier in `events`. Every accepted message goes through here, so the
    statement runs through the driver (`storage.driver_rows`).

    `announce` (PostgreSQL): how many turn workers the same statement notifies of the new
    rows' senders, each sender on its worker's channel (`storage.inbox_signal`), delivered
    when it commits, so a worker never hears of a row it cannot read yet; a statement whose
    rows are all duplicates notifies nobody. 0: none.
    """
    if not events:
        return []
    firsts: dict[tuple[str, str], NewInboundEvent] = {}
    for event in events:
        firsts.setdefault((event.channel_type, event.message_id), event)
    rows = [
        {
            "channel_type": event.channel_type,
            "message_id": event.message_id,
            "sender_key": event.sender_key,
            "received_at": event.received_at,
            "message": driver_rows.JsonValue(event.message),
            "raw_payload": driver_rows.JsonValue(event.raw_payload),
        }
        for event in firsts.values()
    ]
    statement = _accept_many(len(rows), announce=announce)
    found = await driver_rows.rows(scope, statement, driver_rows.numbered(rows))
    ids = {(channel, message_id): row_id for row_id, channel, message_id, *_ in found}
    # pop: the first of several events with one key gets the id, the others None.
    return [ids.pop((event.channel_type, event.message_id), None) for event in events]


@dataclass(frozen=True, slots=True)
class UserQueueRead:
    """The read `send_user_queue` sent; its events through `events`."""

    sent: driver_rows.Sent | None  # None: no identities, nothing to read

    async def events(self) -> list[PendingEvent]:
        """The queue's events (in a pipeline, after waiting for the answer unless another
        statement's wait brought it already)."""
        return [_pending(row) for row in await self.sent.rows()] if self.sent else []


async def send_user_queue(
    scope: driver_rows.DriverScope, sender_keys: Sequence[str], *, limit: int = 1
) -> UserQueueRead:
    """Read the oldest unfinished events sent from any of these identities (one user's
    queue); in a `driver_rows.pipelined` block without waiting, so it goes to the database
    with the statements around it. Every turn reads it: through the driver
    (`storage.driver_rows`), as plain values."""
    if not sender_keys:
        return UserQueueRead(None)
    sent = await driver_rows.send(
        scope,
        _next_pending(len(sender_keys)),
        {"limit": limit, **{f"key_{i}": key for i, key in enumerate(sender_keys)}},
    )
    return UserQueueRead(sent)
