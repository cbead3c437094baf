"""The dispatcher: takes accepted messages off the inbox and runs their turns.

Each user has one queue: the pending events sent from any of their identities, in arrival
order. A user's queue is drained by whoever holds the user's turn lock (an advisory lock on
PostgreSQL, so this holds across processes), one event at a time, oldest first; so turns of
one user, and therefore of each of their sessions, never interleave, and messages queued while
a turn runs are answered one by one, each turn seeing the ones before it. Different users run
concurrently, at most `max_concurrent_turns` at once, not counting those whose reply is sent and
whose transcript segment is being written.

Work is found by polling the inbox (which also picks up what a crashed process left behind)
and, within a process, at once through `notify()` when the inbox accepts a message. A turn
worker hears of its share of the senders (`storage.inbox_signal`), and its polls take the
other workers' senders only once their events have waited `TAKEOVER_AFTER`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from channels.base import ChannelMessage
from errors import GatewayError
from gateway.identity import IdentityResolver, ResolvedUser
from gateway.log import get_logger
from gateway.turn_values import QueuedEvent
from gateway.turns import TurnProcessor
from gateway.work_slots import WorkSlots
from primitives.bounded_cache import BoundedCache
from primitives.single_flight import SingleFlight
from storage.column_types import utcnow
from storage.database import Database
from storage.driver_rows import DriverScope, pipelined
from storage.inbox_signal import TAKEOVER_AFTER, WorkerShare
from storage.locks import Held, TurnLocks
from storage.repositories.inbox import InboxRepository, UserQueueRead, send_user_queue
from storage.repositories.session_state import CurrentSessionsRead, read_current_sessions

log = get_logger(__name__)

DRAIN_BATCH = 16
# Users whose turn lock another process held at the last try, remembered at most.
CONTENDED_USERS = 10_000
RESOLVE_SLOTS = 8  # senders resolved (looked up or provisioned) at once
ARRIVALS_KEPT_PER_SENDER = 4  # new messages whose status waits for their sender's resolution


@dataclass(frozen=True, slots=True)
class QueueRead:
    """A read of a user's queue, with their current sessions, sent (`send_queue_read`)."""

    current: CurrentSessionsRead
    queue: UserQueueRead

    async def events(self) -> list[QueuedEvent]:
        """The queue's events, the first carrying the user's current sessions: read under
        the turn lock, they are what its turn would read (nothing else changes them while
        the lock is held); the events after it come after a turn's write."""
        sessions = await self.current.value()
        events = [QueuedEvent.of(row) for row in await self.queue.events()]
        if events:
            events[0] = dataclasses.replace(events[0], current=sessions)
        return events


async def send_queue_read(scope: DriverScope, user_id: str, keys: Sequence[str]) -> QueueRead:
    """Send the read of a user's next batch and of their current sessions (in a pipelined
    block: one round trip, one implicit transaction)."""
    current = await read_current_sessions(scope, user_id)
    return QueueRead(current, await send_user_queue(scope, keys, limit=DRAIN_BATCH))


class Dispatcher:
    """Schedules users' queues onto a bounded number of concurrent drains."""

    def __init__(
        self,
        database: Database,
        identities: IdentityResolver,
        locks: TurnLocks,
        processor: TurnProcessor,
        *,
        turn_slots: WorkSlots,
        poll_interval: float = 1.0,
        share: WorkerShare | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.database = database
        self.identities = identities
        self.locks = locks
        self.processor = processor
        self.poll_interval = poll_interval
        # A turn worker's share: its polls leave the other workers' senders to them until
        # their events have waited `TAKEOVER_AFTER` (`storage.inbox_signal`).
        self.share = share
        self.clock = clock
        # A drain holds one (`sessions.max_concurrent_turns`), stepping aside while its
        # turn's transcript segment is written (`TurnService.mirroring`).
        self._slots = turn_slots
        self._wake = asyncio.Event()
        self._hints: set[str] = set()
        # One drain per user and one resolve per sender at a time; asked again while it runs
        # (it may have read the queue already), it runs once more when it ends.
        self._drains = SingleFlight()
        self._resolves = SingleFlight()
        self._resolve_slots = asyncio.Semaphore(RESOLVE_SLOTS)
        # New messages of senders not resolved yet, whose status shows once they are.
        self._arrivals: dict[str, list[QueuedEvent]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Users whose lock another holder had at the last try (another process, mostly: with
        # several on one database, the one that accepted a user's messages is usually the
        # one answering them, and every other one's poll of the whole inbox finds them
        # pending meanwhile): their next take goes without the queue's read, which would
        # likely be sent for nothing; the holder reads by itself when it does take the lock.
        self._held_elsewhere: BoundedCache[str, bool] = BoundedCache(CONTENDED_USERS)
        self._stopping = False

    def arrived(self, event_id: int, sender_key: str, record: Mapping[str, Any]) -> None:
        """A message this process just accepted: its sender sees at once that the assistant
        is working, before the turn is scheduled, locked and read from the inbox (which, with
        many messages at once, waits for database connections). Not while a turn of the same
        user runs here: its live reply is the one showing status in that conversation. The
        inbox calls this before `notify`, so no turn of the message has started yet."""
        if self._stopping:
            return
        event = QueuedEvent(event_id, ChannelMessage.from_record(record))
        user = self.identities.cached_sender(sender_key)
        if user is None:
            # Shown once the sender is resolved (`_resolve`); a few per sender at most.
            waiting = self._arrivals.setdefault(sender_key, [])
            if len(waiting) < ARRIVALS_KEPT_PER_SENDER:
                waiting.append(event)
            return
        self._show_working(user, [event])

    def _show_working(self, user: ResolvedUser, events: list[QueuedEvent]) -> None:
        if not self._drains.is_running(user.user_id):
            for event in events:
                self.processor.show_working(event, user)

    def notify(self, sender_key: str | None = None) -> None:
        """Work was accepted in this process (from `sender_key`): schedule it now, without
        waiting for the next poll of the inbox."""
        if sender_key is not None:
            self._hints.add(sender_key)
        self._wake.set()

    async def run(self) -> None:
        """Schedule work until `stop()`: hinted senders at once, the whole inbox every poll."""
        log.info("dispatcher.started", poll_interval=self.poll_interval)
        loop = asyncio.get_running_loop()
        next_poll = loop.time()
        while not self._stopping:
            self._wake.clear()
            try:
                if loop.time() >= next_poll:
                    next_poll = loop.time() + self.poll_interval
                    self._hints.clear()
                    await self.schedule()
                else:
                    hints, self._hints = self._hints, set()
                    await self.schedule(sorted(hints))
            except (GatewayError, OSError) as exc:
                log.error("dispatcher.schedule_failed", error=str(exc).splitlines()[0])
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(next_poll - loop.time(), 0.0))

    async def stop(self, *, grace: float = 30.0) -> None:
        """Stop scheduling; give running turns `grace` seconds to finish, then cancel them.

        A cancelled turn is not lost: its event is still pending in the inbox (and its user
        message, if already appended, is not appended again), so the next start answers it.
        """
        self._stopping = True
        self._wake.set()
        if not self._tasks:
            return
        _, unfinished = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in unfinished:
            task.cancel()
        if unfinished:
            log.warning("dispatcher.turns_cancelled", count=len(unfinished))
            await asyncio.gather(*unfinished, return_exceptions=True)

    async def schedule(self, senders: list[str] | None = None) -> None:
        """Start a drain for every user with pending events (of `senders`, or of anyone in
        the inbox) who is not being drained here already.

        A poll of the whole inbox (`senders` None) leaves users whose drain is running
        alone: their pending events are mostly the ones that drain is answering, and asking
        it to run once more would read the queue again for nothing (it was one more read, and
        a turn lock taken and given back, per message under load). An event that arrives
        meanwhile is hinted (`notify`, in this process or through the database's
        notification); one whose hint was lost is found by the first poll after the drain."""
        polled = senders is None
        if senders is None:
            async with self.database.single() as db:
                senders = await InboxRepository(db).pending_senders(
                    share=self.share, before=self.clock() - TAKEOVER_AFTER
                )
        for sender in senders:
            if self._stopping:
                return
            known = self.identities.cached_sender(sender)
            if known is not None:
                if polled and self._drains.is_running(known.user_id):
                    continue
                self._show_working(known, self._arrivals.pop(sender, []))
                self._drain_now(known)
            else:
                self._start_resolve(sender)

    def _start_resolve(self, sender: str) -> None:
        # A sender not seen lately takes a few round trips to resolve (or provision): done
        # beside the other senders, not one after another. One already under way may have
        # read the sender's events already: it runs once more instead.
        if self._resolves.begin(sender):
            self._track(asyncio.create_task(self._resolve(sender), name=f"resolve:{sender}"))

    async def _resolve(self, sender: str) -> None:
        user = None
        try:
            async with self._resolve_slots:
                user = await self._user_of(sender)
        except (GatewayError, OSError) as exc:
            log.error("dispatcher.resolve_failed", sender=sender, error=str(exc))
        finally:
            again = self._resolves.end(sender)
            arrivals = self._arrivals.pop(sender, [])
        if self._stopping:
            return
        if user is not None:
            self._show_working(user, arrivals)
            self._drain_now(user)  # the drain reads the queue: no second resolve needed
        elif again:
            self._start_resolve(sender)

    def is_draining(self, user_id: str) -> bool:
        """Whether this process is answering the user's queue now (its turn lock held, or
        about to be), including the work that follows a sent reply."""
        return self._drains.is_running(user_id)

    def _drain_now(self, user: ResolvedUser) -> None:
        # A running drain may already have looked at the queue: it runs once more instead.
        if self._drains.begin(user.user_id):
            self._track(asyncio.create_task(self._drain(user), name=f"drain:{user.user_id}"))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _user_of(self, sender: str) -> ResolvedUser | None:
        """The sender's user; unknown senders' events are rejected here (None)."""
        known = await self.identities.known_sender(sender)
        if known is not None:
            return known
        async with self.database.session() as db:
            inbox = InboxRepository(db)
            event_ids = await inbox.pending_ids_of_sender(sender)
            first = await inbox.queued(event_ids[0]) if event_ids else None
        if first is None:
            return None
        user = await self.identities.resolve(ChannelMessage.from_record(first.message))
        if user is not None:
            return user
        for event_id in event_ids:
            async with self.database.session() as db:
                event = await InboxRepository(db).queued(event_id)
            if event is not None:
                await self.processor.reject_unknown_sender(QueuedEvent.of(event))
        return None

    async def _drain(self, user: ResolvedUser) -> None:
        try:
            async with self._slots.working():
                keys = await self.identities.identity_keys(user.user_id)
                async with self._take(user.user_id, keys) as held:
                    if held:
                        await self._drain_held(user, keys, held.first)
                    else:
                        self._held_elsewhere.put(user.user_id, True)
        except (GatewayError, OSError) as exc:
            # Typically the database going away; the events stay pending for the next pass.
            log.error("dispatcher.drain_failed", user_id=user.user_id, error=str(exc))
        finally:
            if self._drains.end(user.user_id) and not self._stopping:
                self._drain_now(user)

    def _take(
        self, user_id: str, keys: Sequence[str]
    ) -> AbstractAsyncContextManager[Held[QueueRead]]:
        """The user's turn lock, with the first batch read in the round trip that takes it,
        unless the lock was held by another holder at the last try."""
        key = f"user:{user_id}"
        if self._held_elsewhere.pop(user_id):
            return self._take_without_reading(key)
        first = functools.partial(send_queue_read, user_id=user_id, keys=keys)
        return self.locks.hold_reading(key, first)

    @asynccontextmanager
    async def _take_without_reading(self, key: str) -> AsyncIterator[Held[QueueRead]]:
        async with self.locks.hold(key) as taken:
            yield Held(taken)

    async def _drain_held(
        self, user: ResolvedUser, keys: Sequence[str], first: QueueRead | None
    ) -> None:
        while not self._stopping:
            # A few at a time: the batch is read under the lock, so it is still in order and
            # nobody else takes from it; each event is re-checked when its turn finishes it.
            if first is not None:
                events, first = await first.events(), None
            else:
                async with self.database.statement(writes=False) as scope:
                    async with pipelined(scope):
                        read = await send_queue_read(scope, user.user_id, keys)
                    # Read once the block has ended: its end waited for the answers (a wait
                    # inside it would be a round trip of its own, before the end's).
                    events = await read.events()
            if not events:
                return
            for event in events:
                if self._stopping:
                    return
                if not await self.processor.process(event, user):
                    break  # it failed and is retried first: read the queue again
            else:
                if len(events) < DRAIN_BATCH:
                    # The queue was shorter than a batch and is answered. What arrived since
                    # is not missed without reading again: this process's inbox reschedules
                    # the user (`notify` → `_drains`), another process's poll finds it.
                    return
