"""What a turn reads that rarely changes, kept between turns instead of read on each one.

A turn's context is the session's messages since its last compaction, the organization, the
user's memory facts and recent session summaries. Read afresh, that is a query per piece and
every message since the compaction loaded again on every turn. Here:

- `HistoryCache` keeps each session's messages since its last compaction. It is checked
  against the session row the turn reads anyway: the row's `compaction_count` and `last_seq`
  say exactly whether anything changed, in this process or another, so a turn reads only the
  messages it has not seen (usually none: its own writes extend the cache) and a compaction
  or a gap makes it read the whole window again. Correct across processes by construction.
- `OrganizationCache` and `MemoryCache` keep the organization and a user's facts and
  summaries for `ttl` seconds. Their writers are the configuration (every process applies its
  own), compaction and the leader's summary job; a write in this process forgets the entry at
  once (`forget`), one in another process is seen within `ttl`. Facts and summaries describe
  sessions that ended hours before, so that delay is invisible in a conversation. On
  PostgreSQL every change to a user's memory is announced (`storage.memory_signal`): while
  they are heard (`changed`), a memory entry is dropped at once and kept `announced_ttl`.

Every cache is bounded (least recently used entries go first).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from primitives.bounded_cache import BoundedCache
from sessions.compaction import as_history
from sessions.context import HistoryMessage
from sessions.memory import RetentionPolicy, SessionSummary
from storage.driver_rows import pipelined
from storage.repositories.compactions import CompactionRepository
from storage.repositories.memory import send_fact_texts
from storage.repositories.session_state import SessionState
from storage.repositories.sessions import history_messages
from storage.repositories.summaries import send_recent_summaries
from storage.repositories.users import OrganizationRepository


@dataclass(frozen=True, slots=True)
class SessionHistory:
    """A session's messages since its last compaction, as of `last_seq`."""

    compaction_count: int
    after_seq: int  # the last message the latest compaction covered (0: none yet)
    summary: str | None  # that compaction's summary
    last_seq: int
    messages: tuple[HistoryMessage, ...]


class HistoryCache:
    """Each session's history since its last compaction, read once and then extended."""

    def __init__(self, max_messages: int = 200_000) -> None:
        self._entries: BoundedCache[str, SessionHistory] = BoundedCache(
            max_messages, weigh=lambda history: len(history.messages) + 1
        )

    async def read(self, db: AsyncSession, session: SessionState) -> SessionHistory:
        """The history of `session` (the row read in this transaction) up to its `last_seq`."""
        cached = self._entries.get(session.id)
        if cached is None and session.last_seq == 0 and session.compaction_count == 0:
            # A session with no message yet (typically created by this turn): nothing to read.
            cached = SessionHistory(0, 0, None, 0, ())
        elif (
            cached is None
            or cached.compaction_count != session.compaction_count
            or cached.last_seq > session.last_seq
        ):
            latest = await CompactionRepository(db).latest(session.id)
            after = latest.last_message_seq if latest else 0
            rows = await history_messages(
                db, session.id, after_seq=after, through_seq=session.last_seq
            )
            cached = SessionHistory(
                session.compaction_count,
                after,
                latest.summary if latest else None,
                session.last_seq,
                tuple(as_history(rows)),
            )
        elif cached.last_seq < session.last_seq:
            # Written by another process (or a turn whose cache update was lost): the rest.
            rows = await history_messages(
                db, session.id, after_seq=cached.last_seq, through_seq=session.last_seq
            )
            cached = self._extended(cached, as_history(rows), session.last_seq)
        self._entries.put(session.id, cached)
        return cached

    def extend(
        self, session_id: str, *, after_seq: int, messages: Sequence[HistoryMessage]
    ) -> None:
        """Add the messages a turn just committed after `after_seq` (the cache must be at
        exactly that point, else it is left to be checked against the row next time)."""
        cached = self._entries.get(session_id)
        if cached is None or cached.last_seq != after_seq or not messages:
            return
        self._entries.put(session_id, self._extended(cached, list(messages), messages[-1].seq))

    def recent(
        self, session_id: str, *, through_seq: int, count: int
    ) -> tuple[HistoryMessage, ...] | None:
        """The last `count` messages up to `through_seq` when the cache holds the session at
        exactly that point with that many messages since its compaction (else None)."""
        cached = self._entries.get(session_id)
        if cached is None or cached.last_seq != through_seq:
            return None
        if len(cached.messages) < count and cached.after_seq > 0:
            return None  # older ones are behind the compaction: read them from the database
        return cached.messages[-count:]

    def forget(self, session_id: str) -> None:
        """Drop the session's entry (deleted, or changed in a way the row does not show)."""
        self._entries.pop(session_id)

    @staticmethod
    def _extended(
        cached: SessionHistory, messages: Sequence[HistoryMessage], last_seq: int
    ) -> SessionHistory:
        return SessionHistory(
            cached.compaction_count,
            cached.after_seq,
            cached.summary,
            last_seq,
            (*cached.messages, *messages),
        )


class _Unread(enum.Enum):
    """The cache holds nothing for the key (as opposed to holding "no such organization")."""

    UNREAD = enum.auto()


@dataclass(frozen=True, slots=True)
class OrganizationFacts:
    """What a turn's context says of its organization."""

    name: str
    context: str


class OrganizationCache:
    """Organizations by id, each read at most once per `ttl` seconds."""

    def __init__(self, ttl: float = 60.0, max_entries: int = 10_000) -> None:
        self._entries: BoundedCache[str, OrganizationFacts | None] = BoundedCache(
            max_entries, ttl=ttl
        )

    async def get(self, db: AsyncSession, org_id: str) -> OrganizationFacts | None:
        """The organization's name and context, or None when there is no such organization."""
        cached = self._entries.get(org_id, _Unread.UNREAD)
        if cached is _Unread.UNREAD:
            row = await OrganizationRepository(db).get(org_id)
            cached = OrganizationFacts(row.name, row.context) if row is not None else None
            self._entries.put(org_id, cached)
        return cached

    def clear(self) -> None:
        """Forget every organization (the configuration was applied again)."""
        self._entries.clear()


@dataclass(frozen=True, slots=True)
class UserMemory:
    """A user's memory facts (oldest first) and newest session summaries (newest first)."""

    facts: tuple[str, ...]
    summaries: tuple[SessionSummary, ...]


class MemoryCache:
    """Users' memory facts and recent summaries, each read at most once per `ttl` seconds,
    or per `announced_ttl` while every change to them is heard (`changed`)."""

    def __init__(
        self,
        max_facts: int,
        max_summaries: int,
        retention: RetentionPolicy,
        *,
        ttl: float = 60.0,
        announced_ttl: float = 600.0,
        max_users: int = 20_000,
    ) -> None:
        self.max_facts = max_facts
        # One more than shown: the current session's own summary may be among them.
        self.max_summaries = max_summaries + 1
        self.retention = retention
        self.ttl, self.announced_ttl = ttl, announced_ttl
        self._entries: BoundedCache[str, UserMemory] = BoundedCache(max_users, ttl=ttl)
        # Counts the changes heard: a read that a change overtook is not kept (below).
        self._changes = 0

    async def read(
        self, db: AsyncSession, user_id: str, now: datetime
    ) -> tuple[tuple[str, ...], tuple[SessionSummary, ...]]:
        """The user's facts (oldest first) and summaries within the retention window."""
        cached = self._entries.get(user_id)
        if cached is None:
            changes = self._changes
            async with pipelined(db):  # one round trip for both: the block's end
                facts = await send_fact_texts(db, user_id, limit=self.max_facts)
                summaries = await send_recent_summaries(
                    db, user_id, since=self.retention.cutoff(now), limit=self.max_summaries
                )
            fact_rows, summary_rows = await facts.rows(), await summaries.rows()
            cached = UserMemory(
                tuple(fact for (fact,) in reversed(fact_rows)),
                tuple(SessionSummary(*row) for row in summary_rows),
            )
            # A change heard while the read was out may have committed after its snapshot:
            # kept, the copy would hide it for as long as an entry lives (ten minutes while
            # announcements are heard). This turn uses what it read; the next one reads again.
            if self._changes == changes:
                self._entries.put(user_id, cached)
        cutoff = self.retention.cutoff(now)
        # Summaries only age out of the window between reads; none can enter it unseen.
        return cached.facts, tuple(s for s in cached.summaries if s.created_at >= cutoff)

    def forget(self, user_id: str) -> None:
        """Drop the user's entry (this process just wrote a fact or a summary)."""
        self._changes += 1
        self._entries.pop(user_id)

    def changed(self, user_id: str | None) -> None:
        """A user's memory changed somewhere (`storage.memory_signal`): drop their entry.
        None: the announcements are heard (again), and some may have been missed: drop every
        entry, and keep the next ones `announced_ttl` seconds."""
        if user_id is None:
            self._changes += 1
            self._entries.clear()
            self._entries.ttl = self.announced_ttl
        else:
            self.forget(user_id)

    def unheard(self) -> None:
        """The announcements are cut off: entries are kept `ttl` seconds again (a copy read
        before outlives a change made meanwhile by that long at most)."""
        self._entries.ttl = self.ttl
