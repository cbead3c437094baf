"""Replies waiting in the outbox, written as the gateway writes them, at a fixed time."""

from __future__ import annotations

from datetime import UTC, datetime

from channels.base import ChannelType
from storage.database import Database
from storage.repositories.outbox import OutboxRepository

T0 = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


async def enqueue(
    database: Database,
    message_id: str = "out-1",
    *,
    channel: ChannelType = ChannelType.SLACK,
    channel_id: str = "C1",
    at: datetime = T0,
    thread_id: str = "",
    in_reply_to: str | None = "in-1",
) -> int:
    """Put a reply in the outbox (content `reply <message_id>`); its row id."""
    async with database.session() as db:
        row = await OutboxRepository(db).enqueue(
            message_id=message_id,
            channel_type=channel.value,
            channel_id=channel_id,
            content=f"reply {message_id}",
            at=at,
            thread_id=thread_id,
            in_reply_to=in_reply_to,
            reply_context={"thread_ts": "1.2"},
        )
        return row.id
