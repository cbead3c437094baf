"""Turns as the gateway runs them: commands answered here, messages handed to `sessions`.

The dispatcher calls `TurnProcessor.process` for each event of a user's queue while it holds
the user's turn lock. A chat command is answered here (`gateway.commands`); any other message
becomes a `UserTurn` for `sessions.turn.TurnService`, which owns the turn from routing to the
transcript and commits the reply; the reply is then handed to the outbox sender at once.
A turn that fails is retried (up to three attempts), then apologised for, so one poisoned
message never wedges a user's queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from channels.base import ChannelMessage, ChannelType, FileToSend
from channels.live import LiveChannel, ReplyTarget, TitledChannel
from channels.plugin import ChannelAdapter
from gateway.commands import Command, CommandContext, parse_command, run_command
from gateway.files import FileGatherer
from gateway.identity import ResolvedUser
from gateway.live import HandleOnly, LiveProgress
from gateway.log import bind_turn_context, clear_turn_context, get_logger
from gateway.metrics import GatewayMetrics
from gateway.turn_values import (
    FILE_TURNS,
    QueuedEvent,
    TurnLive,
    TurnSettings,
    arrival_of,
    message_metadata,
    reply_target,
)
from gateway.work_slots import WorkSlots
from sessions.files.turn_files import IncomingFile
from sessions.progress import NO_PROGRESS, TurnProgress
from sessions.turn import TurnService
from sessions.turn_values import LIVE_REPLY_KEY, ReplyAddress, UserTurn, new_outbound_id
from storage.database import Database
from storage.models import InboundStatus
from storage.repositories.inbox import InboxRepository
from storage.repositories.outbox import OutboxRepository, QueuedReply
from storage.transcripts import TranscriptStore

log = get_logger(__name__)

UNKNOWN_SENDER_TEXT = (
    "Hello! You are not enabled to use this assistant yet. "
    "Please ask your administrator to add you."
)
FAILURE_APOLOGY_TEXT = (
    "Sorry, something went wrong while handling your message. The team has been notified."
)
REJECTION_INTERVAL = timedelta(hours=1)
MAX_ATTEMPTS = 3
# A live reply opened as its message arrived and not taken by a turn here within this time
# (another process answered it, or the queue is that long) is closed; a turn opens its own.
EARLY_LIVE_SECONDS = 60.0


class TurnProcessor:
    """Answers inbound events, one at a time, for a user whose turn lock is held."""

    def __init__(
        self,
        database: Database,
        service: TurnService,
        transcripts: TranscriptStore,
        metrics: GatewayMetrics,
        settings: TurnSettings,
        *,
        clock: Callable[[], datetime],
        send_reply: Callable[[QueuedReply], None],
        reply_lease: timedelta,
        work_slots: WorkSlots,
        adapters: Mapping[ChannelType, ChannelAdapter] | None = None,
    ) -> None:
        self.database = database
        self.service = service
        self.transcripts = transcripts
        # Turns wait for the model concurrently but work (read and write the database, build
        # the context) a few at a time; the pool is sized for it (`GatewayRuntime.start`).
        self.work_slots = work_slots
        self.metrics = metrics
        self.settings = settings
        self.clock = clock
        # Replies are committed already claimed by this process for `reply_lease` and handed
        # to `send_reply` once committed: sent at once, without the outbox claiming them; if
        # this process dies first, the lease runs out and any process's outbox sends them.
        self.send_reply = send_reply
        self.reply_lease = reply_lease
        # The channels' adapters (for live replies and thread titles).
        # (The runtime's own map, filled once the channels are open: kept, never copied.)
        self.adapters: Mapping[ChannelType, ChannelAdapter] = {} if adapters is None else adapters
        # The files of a message, from the channel's stash or platform, for its turn.
        self.files = FileGatherer(transcripts, settings.files)
        self._file_turns = asyncio.Semaphore(FILE_TURNS)
        # Live messages of events whose turn failed and waits for another attempt here.
        self._live_handles: dict[int, Mapping[str, Any]] = {}
        # Live replies opened as their message arrived (`show_working`), not yet taken by
        # their turn: with when they were opened.
        self._early: dict[int, tuple[QueuedEvent, TurnLive, float]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def reconfigure(self, settings: TurnSettings) -> None:
        """Apply reloaded routing, budget, public URL and status texts to the next turn."""
        self.settings = settings
        self.service.routing = settings.routing
        self.files.limits = settings.files

    async def process(self, event: QueuedEvent, user: ResolvedUser) -> bool:
        """Answer one event; failures are retried up to three times, then apologised for.

        True when the event is finished; False when it failed and stays first in the user's
        queue for another attempt (nothing after it may be answered before it).
        """
        message = event.message
        bind_turn_context(user_id=user.user_id, channel=message.channel_type.value)
        started = time.perf_counter()
        command = parse_command(message)
        # Opened before waiting for a work slot (or as the message arrived): the status shows
        # while the turn queues.
        live = None
        if command is None:
            early = self._early.pop(event.event_id, None)
            live = early[1] if early is not None else self._open_live(event, user)
        try:
            async with self.work_slots.working():
                try:
                    if command is not None:
                        await self._run_command(event, user, command)
                    elif live is not None:
                        await self._answer(event, user, live)
                except Exception as exc:  # noqa: BLE001
                    # The boundary of one unit of work: whatever a turn fails with (a bug
                    # included) is logged with its traceback and counted; after MAX_ATTEMPTS the
                    # user gets an apology and the queue moves on, so one poisoned message can
                    # never wedge a user's queue.
                    return await self._record_failure(event, user, exc)
                return True
        finally:
            if live is not None:  # a turn that never reached its model (cancelled, failed)
                await self._end_progress(event, live, committed=False)
            clear_turn_context()
            self.metrics.turn_latency.observe(time.perf_counter() - started)

    def show_working(self, event: QueuedEvent, user: ResolvedUser) -> None:
        """Open the live reply of a message that has just arrived, so its status shows before
        the turn is scheduled; the turn takes it over (`process`). One its turn never takes
        (answered by another process) is closed after `EARLY_LIVE_SECONDS`."""
        self._close_unclaimed(time.monotonic() - EARLY_LIVE_SECONDS)
        if event.event_id in self._early or parse_command(event.message) is not None:
            return
        self._early[event.event_id] = (event, self._open_live(event, user), time.monotonic())

    def _close_unclaimed(self, opened_before: float) -> None:
        for event_id, (event, live, opened_at) in list(self._early.items()):
            if opened_at < opened_before:
                del self._early[event_id]
                task = asyncio.create_task(self._end_progress(event, live, committed=False))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def _open_live(self, event: QueuedEvent, user: ResolvedUser) -> TurnLive:
        """The turn's live reply, showing that the assistant is working."""
        target = reply_target(event.message, user)
        adapter = self.adapters.get(event.message.channel_type)
        return TurnLive(target, adapter, self._progress(event, adapter, target))

    async def reject_unknown_sender(self, event: QueuedEvent) -> None:
        """Refuse an event from a sender with no user: one polite message per hour at most."""
        message = event.message
        channel = message.channel_type.value
        now = self.clock()
        async with self.database.session() as db:
            if not await InboxRepository(db).finish(
                event.event_id, InboundStatus.REJECTED, at=now, error="unknown sender"
            ):
                return  # another worker handled it
            outbox = OutboxRepository(db)
            recently = await outbox.sent_since(
                channel, message.channel_id, "rejection", now - REJECTION_INTERVAL
            )
            reply = None
            if not recently:
                reply = await self._enqueue(
                    db, message, UNKNOWN_SENDER_TEXT, event_id=event.event_id, kind="rejection"
                )
        self.metrics.messages_rejected.labels(channel, "unknown_sender").inc()
        log.warning(
            "identity.unknown_sender",
            channel=channel,
            sender=message.user_identifier,
            tenant=message.tenant,
            message_id=message.message_id,
            notified=not recently,
        )
        self._send(reply)
        await self.files.discard(message)

    async def _answer(self, event: QueuedEvent, user: ResolvedUser, live: TurnLive) -> None:
        message = event.message
        channel = message.channel_type.value
        committed = False
        async with contextlib.AsyncExitStack() as held:
            files: tuple[IncomingFile, ...] = ()
            if message.attachments:
                # The files' bytes stay in memory until the model has answered (a PDF goes
                # in the request): a few such turns at a time. Fetching from the platform is a
                # wait too: the work slot is given up meanwhile.
                async with self.work_slots.waiting():
                    await held.enter_async_context(self._file_turns)
                    files = await self.files.gather(message, live.adapter)
            try:
                result = await self.service.answer(
                    UserTurn(
                        event_id=event.event_id,
                        arrival=arrival_of(message, user),
                        message_id=message.message_id,
                        text=message.prompt_text(),
                        reply_to=ReplyAddress(
                            channel_type=channel,
                            channel_id=message.channel_id,
                            thread_id=message.thread_id,
                            reply_context=message.reply_context,
                            delivered_on_store=channel in self.settings.pull_channels,
                        ),
                        metadata=message_metadata(message),
                        files=files,
                        current=event.current,
                    ),
                    live.progress,
                )
                committed = True
            finally:
                await self._end_progress(event, live, committed=committed)
        provider = self.service.engine.llm.name
        self.metrics.llm_latency.labels(provider).observe(result.model_seconds)
        if result.outbound is None:
            self.metrics.messages_out.labels(channel, "delivered").inc()
        self.metrics.llm_tokens.labels(provider, "input").inc(result.input_tokens)
        self.metrics.llm_tokens.labels(provider, "output").inc(result.output_tokens)
        if result.compacted:
            self.metrics.compactions.inc()
        self._send(result.outbound)
        if message.attachments:
            await self.files.discard(message)  # stored under the session now
        topic = await self.service.after_reply(result)
        if topic and isinstance(live.adapter, TitledChannel):
            await live.adapter.set_title(live.target, topic)

    def _progress(
        self, event: QueuedEvent, adapter: ChannelAdapter | None, target: ReplyTarget
    ) -> TurnProgress:
        """The turn's live reply on its channel, when the channel shows one; otherwise
        progress nobody sees (still finishing the live message of an earlier attempt)."""
        resume = self._live_handles.get(event.event_id) or event.live
        unseen = HandleOnly(resume) if resume else NO_PROGRESS
        # One check of the protocol: `isinstance` against it costs about 16 µs.
        if not isinstance(adapter, LiveChannel):
            return unseen
        try:
            reply = adapter.live_reply(target, resume=resume)
        except Exception as exc:
            # Live progress is a courtesy; the answer still goes out as a plain message.
            log.exception("live.unavailable", error=str(exc))
            return unseen
        if reply is None:
            return unseen
        progress = LiveProgress(
            reply,
            interval=adapter.live_interval,
            status_texts=self.settings.status_texts,
            remember=functools.partial(self._remember_live, event.event_id),
            resumed=resume,
            observe=functools.partial(self._observe_live, adapter.channel_type.value),
        )
        progress.status("thinking")
        return progress

    def _observe_live(self, channel: str, kind: str, outcome: str) -> None:
        self.metrics.live_updates.labels(channel, kind, outcome).inc()

    async def _remember_live(self, event_id: int, handle: Mapping[str, Any]) -> None:
        """Store the live message with the inbound event (a restart finishes it)."""
        async with self.database.session() as db:
            await InboxRepository(db).record_live_reply(event_id, dict(handle))

    async def _end_progress(self, event: QueuedEvent, live: TurnLive, *, committed: bool) -> None:
        """After the turn (once): a committed reply carries its live message; a failed turn
        keeps it for the next attempt (or the apology) and lets the channel clear its
        indicators."""
        if live.ended:
            return
        live.ended = True
        progress = live.progress
        if committed:
            self._live_handles.pop(event.event_id, None)
        else:
            handle = await progress.settle()
            if handle is not None:
                self._live_handles[event.event_id] = handle
        if isinstance(progress, LiveProgress):
            await progress.close(committed=committed)

    async def _run_command(self, event: QueuedEvent, user: ResolvedUser, command: Command) -> None:
        message = event.message
        now = self.clock()
        async with self.database.session() as db:
            outcome = await run_command(
                command,
                CommandContext(
                    db=db,
                    user=user,
                    arrival=arrival_of(message, user),
                    message=message,
                    policy=self.settings.routing,
                    history_budget_tokens=self.settings.history_budget_tokens,
                    now=now,
                    transcripts=self.transcripts,
                    public_url=self.settings.public_url,
                    tools=self.service.engine.toolbox,
                ),
            )
            reply = await self._enqueue(
                db,
                message,
                outcome.reply,
                event_id=event.event_id,
                user_id=user.user_id,
                session_id=outcome.session_id,
                kind="command",
                file=outcome.file,
            )
            await InboxRepository(db).finish(event.event_id, InboundStatus.DONE, at=now)
        self._send(reply)

    async def _record_failure(self, event: QueuedEvent, user: ResolvedUser, exc: Exception) -> bool:
        log.exception("turn.failed", event_id=event.event_id, error=str(exc))
        async with self.database.session() as db:
            attempts = await InboxRepository(db).record_failure(event.event_id, str(exc)[:2000])
        if attempts < MAX_ATTEMPTS:
            return False
        message = event.message
        async with self.database.session() as db:
            finished = await InboxRepository(db).finish(
                event.event_id, InboundStatus.FAILED, at=self.clock(), error=str(exc)[:2000]
            )
            reply = None
            live = self._live_handles.pop(event.event_id, None) or event.live
            if finished:
                reply = await self._enqueue(
                    db,
                    message,
                    FAILURE_APOLOGY_TEXT,
                    event_id=event.event_id,
                    user_id=user.user_id,
                    kind="notice",
                    live=live,
                )
        self._send(reply)
        if finished and message.attachments:
            await self.files.discard(message)  # nothing will read them any more
        return True

    async def _enqueue(
        self,
        db: AsyncSession,
        message: ChannelMessage,
        text: str,
        *,
        event_id: int,
        user_id: str | None = None,
        session_id: str | None = None,
        kind: str = "reply",
        file: FileToSend | None = None,
        live: Mapping[str, Any] | None = None,
    ) -> QueuedReply | None:
        """Add a reply to the outbox in the caller's transaction; the row to send once that
        commits, or None for channels whose clients fetch their replies."""
        delivered = message.channel_type.value in self.settings.pull_channels
        if delivered:
            self.metrics.messages_out.labels(message.channel_type.value, "delivered").inc()
        now = self.clock()
        reply_context = dict(message.reply_context)
        if live is not None:
            # The live message an earlier attempt streamed into: this reply finishes it.
            reply_context[LIVE_REPLY_KEY] = dict(live)
        row = await OutboxRepository(db).enqueue(
            delivered=delivered,
            message_id=new_outbound_id(),
            channel_type=message.channel_type.value,
            channel_id=message.channel_id,
            thread_id=message.thread_id,
            in_reply_to=message.message_id,
            kind=kind,
            content=text,
            user_id=user_id,
            session_id=session_id,
            inbound_event_id=event_id,
            reply_context=reply_context,
            attachment=dataclasses.asdict(file) if file is not None else None,
            at=now,
            claimed_until=now + self.reply_lease,
        )
        return None if delivered else row

    def _send(self, reply: QueuedReply | None) -> None:
        """Hand a committed reply to the outbox sender."""
        if reply is not None:
            self.send_reply(reply)
