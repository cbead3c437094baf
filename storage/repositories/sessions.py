"""Sessions, the channels and threads they span, and their messages."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage import driver_rows
from storage.column_types import utcnow
from storage.models import Session, SessionChannel, SessionMessage, SessionStatus
from storage.repositories.session_state import insert_session
from storage.turn_store import MessageToStore, send_channel, store_turn_messages


@dataclass(frozen=True, slots=True)
class OwnMessage:
    """A message a user sent, as their channel's history shows it again."""

    session_id: str
    message_id: str | None
    thread_id: str
    content: str
    metadata: dict[str, Any] | None
    created_at: datetime


class SessionRepository:
    """Sessions, the channels they span, and their messages."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def create(
        self, user_id: str, org_id: str, *, scope_channel: str | None = None, at: datetime
    ) -> Session:
        """Start a new active session for the user (`insert_session`) and load its row."""
        state = await insert_session(
            self.session, user_id, org_id, scope_channel=scope_channel, at=at
        )
        row = await self.session.get(Session, state.id)
        if row is None:
            raise StorageError("the new session was not found", key=state.id)
        return row

    async def get(self, session_id: str, *, for_update: bool = False) -> Session | None:
        """The session, or None; `for_update` locks its row until the transaction ends."""
        statement = select(Session).where(Session.id == session_id)
        if for_update:
            statement = statement.with_for_update()
        result = await self.session.execute(statement)
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
        """Note that a message of the session came through this channel/thread
        (`send_channel` in the session's transaction)."""
        await send_channel(self.session, session_id, channel_type, channel_id, thread_id, at=at)

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
        """Append a message with the next sequence number and update the session's counters,
        through the same writer a turn uses (`storage.turn_store.store_turn_messages`, which
        takes the session row's write lock, so two writers never get the same number)."""
        seq = await store_turn_messages(
            self.session,
            session_id,
            [
                MessageToStore(
                    role=role,
                    channel_type=channel_type,
                    content=content,
                    tokens=tokens,
                    thread_id=thread_id,
                    message_id=message_id,
                    in_reply_to=in_reply_to,
                    metadata=metadata or {},
                )
            ],
            at=at,
        )
        # The counters were moved by a Core statement: a loaded session row must read them again.
        loaded = self.session.identity_map.get(self.session.identity_key(Session, (session_id,)))
        if loaded is not None:
            await self.session.refresh(loaded)
        row = await self.session.scalar(
            select(SessionMessage).where(
                SessionMessage.session_id == session_id, SessionMessage.seq == seq
            )
        )
        if row is None:  # the insert above wrote it; only a broken transaction misses it
            raise StorageError("the appended message is missing", key=session_id)
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

    async def user_messages_on(
        self, user_id: str, channel_type: str, *, message_id_prefix: str, limit: int
    ) -> list[OwnMessage]:
        """The user's own newest messages on one channel across their sessions, newest first,
        those whose platform id starts with `message_id_prefix` (one identity's messages)."""
        result = await self.session.execute(
            select(
                SessionMessage.session_id,
                SessionMessage.message_id,
                SessionMessage.thread_id,
                SessionMessage.content,
                SessionMessage.metadata_json,
                SessionMessage.created_at,
            )
            .join(Session, Session.id == SessionMessage.session_id)
            .where(
                Session.user_id == user_id,
                SessionMessage.role == "user",
                SessionMessage.channel_type == channel_type,
                SessionMessage.message_id.startswith(message_id_prefix, autoescape=True),
            )
            .order_by(SessionMessage.created_at.desc(), SessionMessage.id.desc())
            .limit(limit)
        )
        return [OwnMessage(*row) for row in result]

    async def delete(self, session_id: str) -> bool:
        """Delete the session and, by cascade, its channels, messages and compactions."""
        result = await self.session.execute(delete(Session).where(Session.id == session_id))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def record_tools_used(self, session_id: str, names: Iterable[str]) -> None:
        """Add `names` to the session's `skills_activated` (each once, first use first)."""
        current = await self.session.scalar(
            select(Session.skills_activated).where(Session.id == session_id)
        )
        used = list(current or [])
        added = [name for name in dict.fromkeys(names) if name not in used]
        if added:
            await self.session.execute(
                update(Session)
                .where(Session.id == session_id)
                .values(skills_activated=used + added)
            )


async def set_topic(
    scope: driver_rows.DriverScope, session_id: str, summary: str, topics: Sequence[str]
) -> None:
    """Replace the session's topic summary and keywords (every few turns, a statement that is
    all its caller does: on a lent connection, `Database.statement`; `updated_at` as the
    model's `onupdate` sets it)."""
    await driver_rows.rows(
        scope,
        "UPDATE sessions SET topic_summary = :summary, topics = :topics, updated_at = :at"
        " WHERE id = :session_id",
        {
            "summary": summary,
            "topics": driver_rows.JsonValue(list(topics)),
            "at": utcnow(),
            "session_id": session_id,
        },
    )


_HISTORY = """SELECT seq, role, content, tokens, thread_id, metadata FROM session_messages
    WHERE session_id = :session_id AND seq > :after_seq AND seq <= :through_seq ORDER BY seq"""


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A stored message as a turn's context takes it (`history_messages`)."""

    seq: int
    role: str
    content: str
    tokens: int
    thread_id: str
    metadata_json: dict[str, Any]


async def history_messages(
    scope: driver_rows.DriverScope, session_id: str, *, after_seq: int, through_seq: int
) -> list[StoredMessage]:
    """The session's messages after `after_seq` up to `through_seq`, in sequence order,
    through the driver: what a turn's context or topic reads when its process's copy of the
    history is missing or behind (another process answered the user's last turn, for
    replicas behind a load balancer most turns); through the ORM each read cost its object
    loading (0.56-0.59 against 0.37 CPU-ms for two messages, `bench/README.md`)."""
    found = await driver_rows.rows(
        scope,
        _HISTORY,
        {"session_id": session_id, "after_seq": after_seq, "through_seq": through_seq},
    )
    return [
        StoredMessage(
            seq=int(seq),
            role=role,
            content=content,
            tokens=int(tokens),
            thread_id=thread_id,
            metadata_json=driver_rows.json_value(metadata) or {},
        )
        for seq, role, content, tokens, thread_id, metadata in found
    ]
