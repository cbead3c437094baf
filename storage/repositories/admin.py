"""The queries of administration, retention and the metrics gauges: listings across users.

Kept apart from the per-user repositories beside it because nothing on a user's turn runs
them; like those, it holds no rules, only how to read and delete.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import (
    InboundEvent,
    InboundStatus,
    Session,
    SessionChannel,
    SessionStatus,
    User,
    UserChannelIdentity,
)


class AdminRepository:
    """Listings and bulk deletions for admins, retention and gauges."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def sessions(
        self,
        *,
        user_id: str | None = None,
        status: SessionStatus | None = None,
        active_since: datetime | None = None,
        limit: int = 1000,
    ) -> list[Session]:
        """Sessions, most recently active first, optionally of one user, status or period."""
        statement = select(Session).order_by(Session.last_active_at.desc()).limit(limit)
        if user_id is not None:
            statement = statement.where(Session.user_id == user_id)
        if status is not None:
            statement = statement.where(Session.status == status.value)
        if active_since is not None:
            statement = statement.where(Session.last_active_at >= active_since)
        return list((await self.session.execute(statement)).scalars())

    async def channels_of(self, session_ids: Sequence[str]) -> dict[str, list[SessionChannel]]:
        """The channels of each session, in the order they joined."""
        found: dict[str, list[SessionChannel]] = {}
        if not session_ids:
            return found
        rows = await self.session.execute(
            select(SessionChannel)
            .where(SessionChannel.session_id.in_(session_ids))
            .order_by(SessionChannel.id)
        )
        for channel in rows.scalars():
            found.setdefault(channel.session_id, []).append(channel)
        return found

    async def identities_of(self, user_ids: Sequence[str]) -> dict[str, list[UserChannelIdentity]]:
        """The channel identities of each user."""
        found: dict[str, list[UserChannelIdentity]] = {}
        if not user_ids:
            return found
        rows = await self.session.execute(
            select(UserChannelIdentity)
            .where(UserChannelIdentity.user_id.in_(user_ids))
            .order_by(UserChannelIdentity.channel_type, UserChannelIdentity.external_id)
        )
        for identity in rows.scalars():
            found.setdefault(identity.user_id, []).append(identity)
        return found

    async def users(self) -> list[User]:
        """Every user, by id."""
        return list((await self.session.execute(select(User).order_by(User.id))).scalars())

    async def session_count(self, user_id: str) -> int:
        """How many sessions the user has."""
        count = await self.session.scalar(
            select(func.count()).select_from(Session).where(Session.user_id == user_id)
        )
        return int(count or 0)

    async def session_counts(self) -> dict[str, int]:
        """How many sessions each user has (users without any are absent)."""
        grouped = await self.session.execute(
            select(Session.user_id, func.count()).group_by(Session.user_id)
        )
        return {user_id: int(count) for user_id, count in grouped}

    async def delete_events_of_senders(self, sender_keys: Sequence[str]) -> int:
        """Delete the inbound events of these senders (their words, also unattributed ones)."""
        if not sender_keys:
            return 0
        result = await self.session.execute(
            delete(InboundEvent).where(InboundEvent.sender_key.in_(sender_keys))
        )
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def archived_before(self, cutoff: datetime, *, limit: int) -> list[tuple[str, str]]:
        """(session id, user id) of archived sessions last active before `cutoff`."""
        rows = await self.session.execute(
            select(Session.id, Session.user_id)
            .where(
                Session.status == SessionStatus.ARCHIVED.value,
                Session.last_active_at < cutoff,
            )
            .limit(limit)
        )
        return [(session_id, user_id) for session_id, user_id in rows]

    async def gauges(self) -> tuple[int, int]:
        """Active sessions and pending inbound events, for the metrics."""
        active = await self.session.scalar(
            select(func.count())
            .select_from(Session)
            .where(Session.status == SessionStatus.ACTIVE.value)
        )
        pending = await self.session.scalar(
            select(func.count())
            .select_from(InboundEvent)
            .where(InboundEvent.status == InboundStatus.PENDING.value)
        )
        return int(active or 0), int(pending or 0)
