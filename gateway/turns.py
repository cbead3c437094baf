"""Turns as the gateway runs them: commands answered here, messages handed to `sessions`.

The dispatcher calls `TurnProcessor.process` for each event of a user's queue while it holds
the user's turn lock. A chat command is answered here (`gateway.commands`); any other message
becomes a `UserTurn` for `sessions.turn.TurnService`, which owns the turn from routing to the
transcript and commits the reply; the reply is then handed to the outbox sender at once.
A turn that fails is retried (up to three attempts), then apologised for, so one poisoned
message never wedges a user's queue.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from channels.base import ChannelMessage, FileToSend
from gateway.commands import Command, CommandContext, parse_command, run_command
from gateway.identity import ResolvedUser
from gateway.log import bind_turn_context, clear_turn_context, get_logger
from gateway.metrics import GatewayMetrics
from gateway.work_slots import WorkSlots
from sessions.routing import Arrival, RoutingPolicy
from sessions.turn import ReplyAddress, TurnService, UserTurn, new_outbound_id
from storage.database import Database
from storage.models import InboundEvent, InboundStatus
from storage.models import OutboundMessage as OutboundRow
from storage.repositories.inbox import InboxRepository
from storage.repositories.outbox import OutboxRepository
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


@dataclass(frozen=True, slots=True)
class QueuedEvent:
    """An accepted message waiting in a user's queue."""

    event_id: int
    message: ChannelMessage

    @classmethod
    def of(cls, row: InboundEvent) -> QueuedEvent:
        """The value of an inbox row."""
        return cls(row.id, ChannelMessage.from_record(row.message))


@dataclass(frozen=True, slots=True)
class TurnSettings:
    """The config values a turn depends on."""

    routing: RoutingPolicy
    history_budget_tokens: int
    # Channels whose clients fetch their replies (the web feed): no send step, no outbox pass.
    pull_channels: frozenset[str] = frozenset()
    # Base of links sent to users (exports); empty for links relative to this server.
    public_url: str = ""


def arrival_of(message: ChannelMessage, user: ResolvedUser) -> Arrival:
    """The message as session routing sees it."""
    return Arrival(
        user_id=user.user_id,
        org_id=user.org_id,
        channel_type=message.channel_type.value,
        channel_id=message.channel_id,
        thread_id=message.thread_id,
        references=message.references,
    )


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
        send_reply: Callable[[OutboundRow], None],
        reply_lease: timedelta,
        work_slots: WorkSlots,
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

    def reconfigure(self, settings: TurnSettings) -> None:
        """Apply reloaded routing, budget and public URL to the next turn."""
        self.settings = settings
        self.service.routing = settings.routing

    async def process(self, event: QueuedEvent, user: ResolvedUser) -> bool:
        """Answer one event; failures are retried up to three times, then apologised for.

        True when the event is finished; False when it failed and stays first in the user's
        queue for another attempt (nothing after it may be answered before it).
        """
        message = event.message
        bind_turn_context(user_id=user.user_id, channel=message.channel_type.value)
        started = time.perf_counter()
        try:
            async with self.work_slots.working():
                try:
                    await self._answer(event, user)
                except Exception as exc:  # noqa: BLE001
                    # The boundary of one unit of work: whatever a turn fails with (a bug
                    # included) is logged with its traceback and counted; after MAX_ATTEMPTS the
                    # user gets an apology and the queue moves on, so one poisoned message can
                    # never wedge a user's queue.
                    return await self._record_failure(event, user, exc)
                return True
        finally:
            clear_turn_context()
            self.metrics.turn_latency.observe(time.perf_counter() - started)

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

    async def _answer(self, event: QueuedEvent, user: ResolvedUser) -> None:
        message = event.message
        command = parse_command(message)
        if command is not None:
            await self._run_command(event, user, command)
            return
        channel = message.channel_type.value
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
                metadata=_message_metadata(message),
            )
        )
        provider = self.service.engine.llm.name
        self.metrics.llm_latency.labels(provider).observe(result.model_seconds)
        if result.outbound is None:
            self.metrics.messages_out.labels(channel, "delivered").inc()
        self.metrics.llm_tokens.labels(provider, "input").inc(result.input_tokens)
        self.metrics.llm_tokens.labels(provider, "output").inc(result.output_tokens)
        if result.compacted:
            self.metrics.compactions.inc()
        self._send(result.outbound)
        await self.service.after_reply(result)

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
            if finished:
                reply = await self._enqueue(
                    db,
                    message,
                    FAILURE_APOLOGY_TEXT,
                    event_id=event.event_id,
                    user_id=user.user_id,
                    kind="notice",
                )
        self._send(reply)
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
    ) -> OutboundRow | None:
        """Add a reply to the outbox in the caller's transaction; the row to send once that
        commits, or None for channels whose clients fetch their replies."""
        delivered = message.channel_type.value in self.settings.pull_channels
        if delivered:
            self.metrics.messages_out.labels(message.channel_type.value, "delivered").inc()
        now = self.clock()
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
            reply_context=dict(message.reply_context),
            attachment=dataclasses.asdict(file) if file is not None else None,
            at=now,
            claimed_until=now + self.reply_lease,
        )
        return None if delivered else row

    def _send(self, reply: OutboundRow | None) -> None:
        """Hand a committed reply to the outbox sender."""
        if reply is not None:
            self.send_reply(reply)


def _message_metadata(message: ChannelMessage) -> dict[str, object]:
    metadata: dict[str, object] = {"channel_id": message.channel_id}
    if message.forwarded is not None:
        metadata["forwarded"] = {
            "sender": message.forwarded.sender,
            "subject": message.forwarded.subject,
            "date": message.forwarded.date,
        }
    if message.attachments:
        metadata["attachments"] = [
            {"filename": a.filename, "content_type": a.content_type, "size": a.size}
            for a in message.attachments
        ]
    return metadata
