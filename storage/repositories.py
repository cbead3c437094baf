"""Typed data access: every query the rest of the gateway runs lives here.

Each repository wraps one `AsyncSession` (one transaction, opened by `Database.session()`), so
several repositories can take part in the same unit of work. They hold no business rules: which
session a message belongs to, when to compact or archive, is decided in `sessions/` and
`gateway/`; here is only how to read and write it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, delete, func, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage.models import (
    ExportLink,
    InboundEvent,
    InboundStatus,
    JobLease,
    Organization,
    OutboundMessage,
    OutboundStatus,
    Session,
    SessionChannel,
    SessionCompaction,
    SessionMessage,
    SessionStatus,
    SessionSummary,
    User,
    UserChannelIdentity,
    UserMemoryFact,
    utcnow,
)


def new_session_id() -> str:
    """A fresh, unguessable session id."""
    return uuid.uuid4().hex


def identity_conflict(channel_type: str, external_id: str, owner: str) -> str:
    """Why an identity could not be linked: another user has it."""
    return f"{channel_type} identity {external_id!r} already belongs to user {owner!r}"


# Rows per multi-row statement: well under SQLite's limit of bound parameters.
_BATCH = 500


def _batches(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[start : start + _BATCH] for start in range(0, len(items), _BATCH)]


def _insert(session: AsyncSession, table: Any) -> Any:
    # INSERT … ON CONFLICT is dialect-specific in SQLAlchemy; both dialects spell it the same.
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


class OrganizationRepository:
    """Organizations (tenants)."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def upsert(self, org_id: str, name: str, context: str = "") -> None:
        """Create the organization or update its name and context."""
        statement = _insert(self.session, Organization).values(
            id=org_id, name=name, context=context, created_at=utcnow()
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[Organization.id], set_={"name": name, "context": context}
            )
        )

    async def get(self, org_id: str) -> Organization | None:
        """The organization, or None."""
        return await self.session.get(Organization, org_id)


class UserRepository:
    """Users and their channel identities."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def upsert(
        self,
        user_id: str,
        org_id: str,
        display_name: str = "",
        *,
        is_admin: bool = False,
        provisioned: bool = False,
    ) -> None:
        """Create the user or update its organization, name and admin flag."""
        statement = _insert(self.session, User).values(
            id=user_id,
            org_id=org_id,
            display_name=display_name,
            is_admin=is_admin,
            provisioned=provisioned,
            created_at=utcnow(),
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[User.id],
                set_={"org_id": org_id, "display_name": display_name, "is_admin": is_admin},
            )
        )

    async def get(self, user_id: str) -> User | None:
        """The user, or None."""
        return await self.session.get(User, user_id)

    async def link_identity(self, user_id: str, channel_type: str, external_id: str) -> None:
        """Map (channel type, external id) to the user.

        An identity already linked to a different user is an error, never silently moved: that
        would hand one person's conversations to another.
        """
        conflicts = await self.link_identities([(user_id, channel_type, external_id)])
        if conflicts:
            raise StorageError(identity_conflict(*conflicts[0][1:]))

    async def link_identities(
        self, identities: Sequence[tuple[str, str, str]]
    ) -> list[tuple[str, str, str, str]]:
        """Map many (user id, channel type, external id) at once, in batches.

        Identities already linked to a different user are left as they are (never moved, as
        in `link_identity`) and returned with their owner: (user id, channel type, external
        id, owner id).
        """
        now = utcnow()
        for batch in _batches(identities):
            await self.session.execute(
                _insert(self.session, UserChannelIdentity)
                .values(
                    [
                        {
                            "user_id": user_id,
                            "channel_type": channel_type,
                            "external_id": external_id,
                            "created_at": now,
                        }
                        for user_id, channel_type, external_id in batch
                    ]
                )
                .on_conflict_do_nothing(index_elements=["channel_type", "external_id"])
            )
        owners: dict[tuple[str, str], str] = {}
        for batch in _batches(identities):
            result = await self.session.execute(
                select(
                    UserChannelIdentity.channel_type,
                    UserChannelIdentity.external_id,
                    UserChannelIdentity.user_id,
                ).where(
                    tuple_(UserChannelIdentity.channel_type, UserChannelIdentity.external_id).in_(
                        [(channel_type, external_id) for _, channel_type, external_id in batch]
                    )
                )
            )
            owners.update({(row[0], row[1]): row[2] for row in result})
        return [
            (user_id, channel_type, external_id, owners.get((channel_type, external_id), "?"))
            for user_id, channel_type, external_id in identities
            if owners.get((channel_type, external_id)) != user_id
        ]

    async def unlink_identity(self, user_id: str, channel_type: str, external_id: str) -> bool:
        """Remove the user's identity (channel type, external id); False if they had none."""
        result = await self.session.execute(
            delete(UserChannelIdentity).where(
                UserChannelIdentity.user_id == user_id,
                UserChannelIdentity.channel_type == channel_type,
                UserChannelIdentity.external_id == external_id,
            )
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def find_by_identity(self, channel_type: str, external_id: str) -> User | None:
        """The user that owns this channel identity, or None."""
        result = await self.session.execute(
            select(User)
            .join(UserChannelIdentity, UserChannelIdentity.user_id == User.id)
            .where(
                UserChannelIdentity.channel_type == channel_type,
                UserChannelIdentity.external_id == external_id,
            )
        )
        return result.scalar_one_or_none()

    async def identities(self, user_id: str) -> list[UserChannelIdentity]:
        """Every channel identity of the user."""
        result = await self.session.execute(
            select(UserChannelIdentity)
            .where(UserChannelIdentity.user_id == user_id)
            .order_by(UserChannelIdentity.channel_type, UserChannelIdentity.external_id)
        )
        return list(result.scalars())

    async def delete(self, user_id: str) -> bool:
        """Delete the user and, by cascade, everything that belongs to them."""
        result = await self.session.execute(delete(User).where(User.id == user_id))
        return bool(result.rowcount)  # type: ignore[attr-defined]


class SessionRepository:
    """Sessions, the channels they span, and their messages."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def create(
        self, user_id: str, org_id: str, *, scope_channel: str | None = None, at: datetime
    ) -> Session:
        """Start a new active session for the user."""
        row = Session(
            id=new_session_id(),
            user_id=user_id,
            org_id=org_id,
            scope_channel=scope_channel,
            status=SessionStatus.ACTIVE.value,
            created_at=at,
            updated_at=at,
            last_active_at=at,
            current_since=at,
        )
        self.session.add(row)
        await self.session.flush()
        return row

    async def get(self, session_id: str, *, for_update: bool = False) -> Session | None:
        """The session, or None; `for_update` locks its row until the transaction ends."""
        statement = select(Session).where(Session.id == session_id)
        if for_update:
            statement = statement.with_for_update()
        result = await self.session.execute(statement)
        return result.scalar_one_or_none()

    async def find_latest_active(
        self, user_id: str, *, scope_channel: str | None = None
    ) -> Session | None:
        """The user's current session: the active (or compacting) one made current last."""
        result = await self.session.execute(
            select(Session)
            .where(
                Session.user_id == user_id,
                Session.scope_channel.is_(None)
                if scope_channel is None
                else Session.scope_channel == scope_channel,
                Session.status.in_([SessionStatus.ACTIVE.value, SessionStatus.COMPACTING.value]),
            )
            .order_by(Session.current_since.desc(), Session.last_active_at.desc())
            .limit(1)
        )
        return result.scalar_one_or_none()

    async def find_by_thread(
        self, channel_type: str, channel_id: str, thread_id: str
    ) -> Session | None:
        """The session that owns a thread, or None (thread-less channels never match)."""
        if not thread_id:
            return None
        result = await self.session.execute(
            select(Session)
            .join(SessionChannel, SessionChannel.session_id == Session.id)
            .where(
                SessionChannel.channel_type == channel_type,
                SessionChannel.channel_id == channel_id,
                SessionChannel.thread_id == thread_id,
            )
        )
        return result.scalar_one_or_none()

    async def list_for_user(
        self, user_id: str, *, limit: int = 20, statuses: Sequence[SessionStatus] = ()
    ) -> list[Session]:
        """The user's sessions, most recently active first."""
        statement = select(Session).where(Session.user_id == user_id)
        if statuses:
            statement = statement.where(Session.status.in_([status.value for status in statuses]))
        result = await self.session.execute(
            statement.order_by(Session.last_active_at.desc()).limit(limit)
        )
        return list(result.scalars())

    async def find_by_id_prefix(self, user_id: str, prefix: str) -> list[Session]:
        """The user's sessions whose id starts with `prefix` (never another user's)."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        result = await self.session.execute(
            select(Session)
            .where(Session.user_id == user_id, Session.id.like(f"{escaped}%", escape="\\"))
            .order_by(Session.created_at)
            .limit(10)
        )
        return list(result.scalars())

    async def add_usage(
        self, session_id: str, *, input_tokens: int, output_tokens: int, context_tokens: int
    ) -> None:
        """Add a model call's billed tokens and record how full the context was."""
        await self.session.execute(
            update(Session)
            .where(Session.id == session_id)
            .values(
                input_tokens=Session.input_tokens + input_tokens,
                output_tokens=Session.output_tokens + output_tokens,
                context_tokens=context_tokens,
            )
        )

    async def needing_compaction(
        self, *, context_tokens_over: int, limit: int = 20
    ) -> list[Session]:
        """Sessions a compaction was due for but did not finish: left `compacting` by a crash,
        or active with a last context above `context_tokens_over`."""
        result = await self.session.execute(
            select(Session)
            .where(
                (Session.status == SessionStatus.COMPACTING.value)
                | (
                    (Session.status == SessionStatus.ACTIVE.value)
                    & (Session.context_tokens > context_tokens_over)
                )
            )
            .order_by(Session.updated_at)
            .limit(limit)
        )
        return list(result.scalars())

    async def idle_since(self, cutoff: datetime, *, limit: int = 200) -> list[Session]:
        """Active sessions whose last activity is older than `cutoff`."""
        result = await self.session.execute(
            select(Session)
            .where(
                Session.status == SessionStatus.ACTIVE.value,
                Session.last_active_at < cutoff,
            )
            .order_by(Session.last_active_at)
            .limit(limit)
        )
        return list(result.scalars())

    async def record_channel(
        self, session_id: str, channel_type: str, channel_id: str, thread_id: str, *, at: datetime
    ) -> None:
        """Note that a message of the session came through this channel/thread."""
        statement = _insert(self.session, SessionChannel).values(
            session_id=session_id,
            channel_type=channel_type,
            channel_id=channel_id,
            thread_id=thread_id,
            joined_at=at,
            last_message_at=at,
            message_count=1,
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=["session_id", "channel_type", "channel_id", "thread_id"],
                set_={
                    "last_message_at": at,
                    "message_count": SessionChannel.message_count + 1,
                },
            )
        )

    async def channels(self, session_id: str) -> list[SessionChannel]:
        """The channels and threads the session spans, in the order they joined."""
        result = await self.session.execute(
            select(SessionChannel)
            .where(SessionChannel.session_id == session_id)
            .order_by(SessionChannel.joined_at, SessionChannel.id)
        )
        return list(result.scalars())

    async def append_message(
        self,
        session_id: str,
        *,
        role: str,
        channel_type: str,
        content: str,
        at: datetime,
        thread_id: str = "",
        message_id: str | None = None,
        in_reply_to: str | None = None,
        tokens: int = 0,
        metadata: dict[str, Any] | None = None,
    ) -> SessionMessage:
        """Append a message with the next sequence number and update the session's counters.

        The counter update and the insert share the transaction; the `UPDATE … RETURNING`
        takes the session row's write lock, so two writers can never get the same number.
        """
        counters: dict[str, Any] = {
            "last_seq": Session.last_seq + 1,
            "message_count": Session.message_count + 1,
            "last_active_at": at,
            "updated_at": at,
        }
        if role == "user":
            counters["user_message_count"] = Session.user_message_count + 1
        elif role == "assistant":
            counters["assistant_message_count"] = Session.assistant_message_count + 1
        result = await self.session.execute(
            update(Session)
            .where(Session.id == session_id)
            .values(counters)
            .returning(Session.last_seq)
        )
        seq = result.scalar_one_or_none()
        if seq is None:
            raise StorageError(f"session {session_id} does not exist")
        row = SessionMessage(
            session_id=session_id,
            seq=seq,
            role=role,
            channel_type=channel_type,
            thread_id=thread_id,
            message_id=message_id,
            in_reply_to=in_reply_to,
            content=content,
            tokens=tokens,
            created_at=at,
            metadata_json=metadata or {},
        )
        self.session.add(row)
        await self.session.flush()
        return row

    async def messages(
        self,
        session_id: str,
        *,
        after_seq: int = 0,
        through_seq: int | None = None,
        limit: int | None = None,
    ) -> list[SessionMessage]:
        """The session's messages after `after_seq` (up to `through_seq`), in sequence order.

        Pass `through_seq` (the session's `last_seq`) when reading a recent window: bounded on
        both sides, the range is estimated as small and PostgreSQL keeps to the index even for
        a session holding most of the table.
        """
        statement = (
            select(SessionMessage)
            .where(SessionMessage.session_id == session_id, SessionMessage.seq > after_seq)
            .order_by(SessionMessage.seq)
        )
        if through_seq is not None:
            statement = statement.where(SessionMessage.seq <= through_seq)
        if limit is not None:
            statement = statement.limit(limit)
        result = await self.session.execute(statement)
        return list(result.scalars())

    async def set_topic(self, session_id: str, summary: str, topics: Sequence[str]) -> None:
        """Replace the session's topic summary and keywords."""
        await self.session.execute(
            update(Session)
            .where(Session.id == session_id)
            .values(topic_summary=summary, topics=list(topics))
        )

    async def delete(self, session_id: str) -> bool:
        """Delete the session and, by cascade, its channels, messages and compactions."""
        result = await self.session.execute(delete(Session).where(Session.id == session_id))
        return bool(result.rowcount)  # type: ignore[attr-defined]


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
            _insert(self.session, InboundEvent)
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
            _insert(self.session, table)
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


class LeaseRepository:
    """Leases that elect one process to run a background job."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def try_acquire(self, name: str, holder: str, *, now: datetime, ttl: timedelta) -> bool:
        """Take or renew the lease `name` for `holder`; False while another holder's is valid."""
        statement = _insert(self.session, JobLease).values(
            name=name, holder=holder, expires_at=now + ttl
        )
        statement = statement.on_conflict_do_update(
            index_elements=[JobLease.name],
            set_={"holder": holder, "expires_at": now + ttl},
            where=(JobLease.expires_at < now) | (JobLease.holder == holder),
        ).returning(JobLease.holder)
        result = await self.session.execute(statement)
        return result.scalar_one_or_none() == holder

    async def release(self, name: str, holder: str) -> None:
        """Give the lease up early (at shutdown) so another process takes over at once."""
        await self.session.execute(
            delete(JobLease).where(JobLease.name == name, JobLease.holder == holder)
        )


class CompactionRepository:
    """Compactions of sessions."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def latest(self, session_id: str) -> SessionCompaction | None:
        """The session's most recent compaction, or None."""
        result = await self.session.execute(
            select(SessionCompaction)
            .where(SessionCompaction.session_id == session_id)
            .order_by(SessionCompaction.seq.desc())
            .limit(1)
        )
        return result.scalar_one_or_none()

    async def add(self, row: SessionCompaction) -> None:
        """Record a finished compaction."""
        self.session.add(row)
        await self.session.flush()

    async def all_of(self, session_id: str) -> list[SessionCompaction]:
        """All compactions of the session, oldest first."""
        result = await self.session.execute(
            select(SessionCompaction)
            .where(SessionCompaction.session_id == session_id)
            .order_by(SessionCompaction.seq)
        )
        return list(result.scalars())


class MemoryRepository:
    """Durable facts about users."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def remember(
        self,
        user_id: str,
        *,
        fact_key: str,
        fact: str,
        category: str,
        source_session_id: str | None,
        at: datetime,
    ) -> bool:
        """Store a fact unless the user already has one with the same key; True if new."""
        statement = (
            _insert(self.session, UserMemoryFact)
            .values(
                user_id=user_id,
                fact_key=fact_key,
                fact=fact,
                category=category,
                source_session_id=source_session_id,
                created_at=at,
                updated_at=at,
            )
            .on_conflict_do_nothing(index_elements=["user_id", "fact_key"])
            .returning(UserMemoryFact.id)
        )
        result = await self.session.execute(statement)
        return result.scalar_one_or_none() is not None

    async def facts(self, user_id: str, *, limit: int = 200) -> list[UserMemoryFact]:
        """The user's facts, newest first."""
        result = await self.session.execute(
            select(UserMemoryFact)
            .where(UserMemoryFact.user_id == user_id)
            .order_by(UserMemoryFact.created_at.desc(), UserMemoryFact.id.desc())
            .limit(limit)
        )
        return list(result.scalars())


class SummaryRepository:
    """Summaries written when sessions are archived."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(self, row: SessionSummary) -> None:
        """Store a session's summary."""
        self.session.add(row)
        await self.session.flush()

    async def recent(
        self, user_id: str, *, since: datetime, exclude_session_id: str | None, limit: int
    ) -> list[SessionSummary]:
        """The user's newest summaries written since `since`, newest first."""
        statement = select(SessionSummary).where(
            SessionSummary.user_id == user_id, SessionSummary.created_at >= since
        )
        if exclude_session_id is not None:
            statement = statement.where(SessionSummary.session_id != exclude_session_id)
        result = await self.session.execute(
            statement.order_by(SessionSummary.created_at.desc()).limit(limit)
        )
        return list(result.scalars())

    async def archived_without_summary(
        self, *, min_user_messages: int, limit: int = 20
    ) -> list[Session]:
        """Archived sessions long enough to summarise that have no summary yet."""
        summarised = select(SessionSummary.session_id)
        result = await self.session.execute(
            select(Session)
            .where(
                Session.status == SessionStatus.ARCHIVED.value,
                Session.user_message_count >= min_user_messages,
                Session.id.not_in(summarised),
            )
            .order_by(Session.archived_at)
            .limit(limit)
        )
        return list(result.scalars())


class ExportLinkRepository:
    """Expiring download links for session exports."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def create(
        self, token_hash: str, *, user_id: str, session_id: str, at: datetime, expires_at: datetime
    ) -> None:
        """Store a link (by the hash of its token)."""
        self.session.add(
            ExportLink(
                token_hash=token_hash,
                user_id=user_id,
                session_id=session_id,
                created_at=at,
                expires_at=expires_at,
            )
        )
        await self.session.flush()

    async def valid(self, token_hash: str, *, now: datetime) -> ExportLink | None:
        """The link with this token hash, if it has not expired."""
        link = await self.session.get(ExportLink, token_hash)
        return link if link is not None and link.expires_at > now else None
