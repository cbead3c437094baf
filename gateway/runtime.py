"""The running gateway's services, wired from the config, opened at start-up, closed at shutdown.

Start-up fails closed: an unreachable database, a failed migration or an unusable transcript
store raises a `GatewayError` naming the problem before the HTTP server accepts a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from channels.base import ChannelType
from channels.plugin import ChannelAdapter, ChannelServices
from channels.registry import channel_plugin
from gateway.admin import Administration
from gateway.dispatcher import Dispatcher
from gateway.exports import SessionExports
from gateway.files import TranscriptStash
from gateway.identity import IdentityResolver, sync_identities
from gateway.inbox import Inbox
from gateway.jobs import BackgroundJobs
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.open_services import open_engine, open_llm, open_transcript_store, reference_finder
from gateway.outbox import OutboxFeed, OutboxSender, RetryPolicy, SentReplies
from gateway.runtime_settings import RuntimeSettings, runtime_settings
from gateway.settings import GatewayConfig
from gateway.turns import TurnProcessor
from gateway.web_history import WebHistory
from gateway.work_slots import WORK_SLOTS, WaitingLLM, WorkSlots, stepping_aside
from sessions.engine import SessionEngine
from sessions.files.limits import ReadLimits
from sessions.files.reader import FileReader
from sessions.files.turn_files import FileIntake
from sessions.routing import SessionThreads
from sessions.toolbox import McpToolbox
from sessions.turn import TurnService
from storage.column_types import utcnow
from storage.database import Database
from storage.inbox_signal import WorkerShare, inbox_listener
from storage.locks import TurnLocks, turn_locks_for
from storage.memory_signal import memory_listener
from storage.repositories.admin import AdminRepository
from storage.repositories.outbox import OutboxRepository
from storage.transcripts import TranscriptStore

log = get_logger(__name__)

Role = Literal["all", "accept", "turns"]
# Text kept of one file (about 15,000 tokens): under a third of the default history budget, so
# a long document is read in part rather than pushing the whole conversation out.
FILE_TEXT_CHARS = 60_000


def _count_rejections(metrics: GatewayMetrics, channel: str) -> Callable[[int, str], None]:
    def count(status: int, _reason: str) -> None:
        metrics.messages_rejected.labels(channel, str(status)).inc()

    return count


@dataclass
class GatewayRuntime:
    """Everything request handlers and background loops need, wired from the config."""

    config: GatewayConfig
    settings: RuntimeSettings
    database: Database
    transcripts: TranscriptStore
    metrics: GatewayMetrics
    clock: Callable[[], datetime]
    inbox: Inbox
    engine: SessionEngine
    service: TurnService
    dispatcher: Dispatcher
    outbox: OutboxSender
    jobs: BackgroundJobs
    locks: TurnLocks
    admin: Administration
    # The enabled channels' adapters, by channel type (the outbox sends through the same map).
    adapters: dict[ChannelType, ChannelAdapter]
    # all: accept and run turns; accept: only accept (turn workers run them); turns: a turn
    # worker (no HTTP, no email listener, no migrations).
    role: Role = "all"
    # A turn worker's share of the senders (`storage.inbox_signal`); None in other roles.
    share: WorkerShare | None = None
    # The MCP servers (None in a process that runs no turns).
    toolbox: McpToolbox | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def start(
        cls,
        config: GatewayConfig,
        *,
        clock: Callable[[], datetime] = utcnow,
        role: Role = "all",
        worker: int = 0,
    ) -> GatewayRuntime:
        """Open the database (migrating it when `storage.auto_migrate`), the store, the users.

        A turn worker (`role="turns"`, number `worker` of `server.turn_workers`) leaves
        migrations and the users to the process that started it, and listens on no port.
        """
        database = Database(
            config.storage.database_url,
            # Turns use a connection only while they work (never while the model answers), at
            # most WORK_SLOTS at once; the rest is for acknowledgements, the outbox and the
            # jobs, plus the turn locks' own connection. Connections are kept open, as opening
            # one per message would cost more than the work.
            pool_size=config.storage.pool_size + WORK_SLOTS + 1,
            max_overflow=config.storage.pool_size,
        )
        try:
            await database.ping()
            if config.storage.auto_migrate and role != "turns":
                await database.upgrade()
                log.info("storage.migrated", revision=await database.current_revision())
            transcripts = await asyncio.to_thread(open_transcript_store, config.storage.transcripts)
            try:
                await transcripts.check()
                if role != "turns":
                    await sync_identities(database, config)
            except BaseException:
                await transcripts.close()
                raise
        except BaseException:
            await database.dispose()
            raise
        runtime = cls._wire(config, database, transcripts, clock, role, worker=worker)
        try:
            if runtime.toolbox is not None:
                await runtime.toolbox.start()
            for adapter in runtime.adapters.values():
                # A turn worker sends replies but accepts nothing: it opens what sending needs.
                await adapter.open()
                if role != "turns":
                    await adapter.start()
        except BaseException:
            await runtime.close()
            raise
        log.info(
            "gateway.started",
            database=database.display_url,
            transcripts=config.storage.transcripts.backend,
            llm_provider=config.llm.provider,
            channels=sorted(runtime.adapters),
        )
        return runtime

    @classmethod
    def _wire(
        cls,
        config: GatewayConfig,
        database: Database,
        transcripts: TranscriptStore,
        clock: Callable[[], datetime],
        role: Role = "all",
        *,
        worker: int = 0,
    ) -> GatewayRuntime:
        settings = runtime_settings(config)
        metrics = GatewayMetrics()
        metrics.info.info(
            {
                "database": database.url.get_backend_name(),
                "transcripts": config.storage.transcripts.backend,
                "llm_provider": config.llm.provider,
            }
        )
        locks = turn_locks_for(database)
        adapters: dict[ChannelType, ChannelAdapter] = {}
        outbox = OutboxSender(
            database,
            adapters,
            metrics,
            clock=clock,
            policy=RetryPolicy(lease=config.storage.reply_lease),
        )
        work_slots = WorkSlots()
        turn_slots = WorkSlots(config.sessions.max_concurrent_turns)
        # Only processes that run turns start the tool servers.
        toolbox = (
            McpToolbox(settings.tools, on_call=metrics.tool_called) if role != "accept" else None
        )
        engine = open_engine(
            config,
            database,
            transcripts,
            WaitingLLM(open_llm(config), work_slots),
            clock,
            on_archive_failed=metrics.archive_failures.inc,
            settings=settings,
            toolbox=toolbox,
        )
        service = TurnService(
            database,
            engine,
            transcripts,
            settings.turn.routing,
            clock=clock,
            reply_lease=outbox.policy.lease,
            find_referenced=reference_finder(database) if settings.resume_by_reference else None,
            waiting=work_slots.waiting,
            mirroring=lambda: stepping_aside(work_slots, turn_slots),
            files=FileIntake(transcripts, FileReader(ReadLimits(max_text_chars=FILE_TEXT_CHARS))),
        )
        processor = TurnProcessor(
            database,
            service,
            transcripts,
            metrics,
            settings.turn,
            clock=clock,
            send_reply=outbox.send_now,
            reply_lease=outbox.policy.lease,
            work_slots=work_slots,
            adapters=adapters,
        )
        # Accepting only, the turn workers hear of new messages by notification (sent by the
        # inbox's INSERT itself); otherwise the inbox wakes this process's dispatcher (built
        # below, once the adapters exist).
        announce = role == "accept"
        share = (
            WorkerShare.configured(worker, config.server.turn_workers) if role == "turns" else None
        )
        inbox = Inbox(
            database,
            metrics,
            clock=clock,
            workers=config.server.turn_workers,
            on_accept=None if announce else lambda key: dispatcher.notify(key),  # noqa: PLW0108 (bound later)
            # Only a process that runs the turns shows their status as messages arrive.
            on_arrival=None if announce else lambda *arrival: dispatcher.arrived(*arrival),  # noqa: PLW0108 (bound later)
        )
        feed = OutboxFeed(database)
        history = WebHistory(database)
        exports = SessionExports(database, clock)
        for channel_type, channel_settings in settings.channels.items():
            plugin = channel_plugin(channel_type)
            services = ChannelServices(
                inbox=inbox,
                clock=clock,
                on_rejected=_count_rejections(metrics, plugin.name),
                threads=SessionThreads(database, plugin.name),
                sent=SentReplies(database, channel_type),
                feed=feed,
                exports=exports,
                history=history,
                files=TranscriptStash(transcripts),
                file_limits=lambda: processor.settings.files,
            )
            adapters[channel_type] = plugin.open(channel_settings, services)
        email_lookups = {
            channel_type.value: lookup(adapter)
            for channel_type, adapter in adapters.items()
            if (lookup := channel_plugin(channel_type).email_lookup) is not None
        }
        dispatcher = Dispatcher(
            database,
            IdentityResolver(database, config, email_lookups=email_lookups),
            locks,
            processor,
            turn_slots=turn_slots,
            share=share,
            clock=clock,
        )
        admin = Administration(database, transcripts, clock)
        jobs = BackgroundJobs(
            database,
            locks,
            engine,
            archive_after=settings.jobs.archive_after,
            clock=clock,
            admin=admin,
            delete_after=settings.jobs.delete_after,
        )
        return cls(
            config=config,
            settings=settings,
            database=database,
            transcripts=transcripts,
            metrics=metrics,
            clock=clock,
            inbox=inbox,
            engine=engine,
            service=service,
            dispatcher=dispatcher,
            outbox=outbox,
            jobs=jobs,
            locks=locks,
            admin=admin,
            adapters=adapters,
            role=role,
            share=share,
            toolbox=toolbox,
        )

    async def refresh_gauges(self) -> None:
        """Read the backlogs and the active sessions into the metrics (at each scrape)."""
        async with self.database.session() as db:
            outbox = await OutboxRepository(db).backlog()
            active, inbox = await AdminRepository(db).gauges()
        self.metrics.outbox_backlog.set(outbox)
        self.metrics.active_sessions.set(active)
        self.metrics.inbox_backlog.set(inbox)

    def start_background(self) -> None:
        """Start the dispatcher, the outbox sender and the background jobs (not in a process
        that only accepts); a turn worker also listens for the accepting process's news, and on
        PostgreSQL every process that runs turns for changes to users' memory."""
        if self.role == "accept":
            return
        loops: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
            ("dispatcher", self.dispatcher.run),
            ("outbox", self.outbox.run),
            ("jobs", self.jobs.run),
        ]
        if self.share is not None:
            listener = inbox_listener(self.database.url, self.dispatcher.notify, self.share)
            loops.append(("inbox-listener", listener.run))
        if not self.database.is_sqlite:
            # Any process's change to a user's memory reaches this one's cache at once, so
            # a copy is kept longer than a TTL alone would allow, while it is heard.
            memories = self.engine.memories
            listener = memory_listener(self.database.url, memories.changed, memories.unheard)
            loops.append(("memory-listener", listener.run))
        for name, loop in loops:
            self._tasks.append(asyncio.create_task(loop(), name=name))

    async def close(self) -> None:
        """Stop the loops (turns in flight finish; unfinished work stays in the database)."""
        for adapter in self.adapters.values():
            await adapter.stop()
        await self.dispatcher.stop()
        self.outbox.stop()
        self.jobs.stop()
        for task in self._tasks:
            if task.get_name() in ("inbox-listener", "memory-listener"):
                task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.locks.close()
        if self.toolbox is not None:
            await self.toolbox.close()
        await self.engine.llm.close()
        if self.service.files is not None:
            self.service.files.reader.close()
        await self.transcripts.close()
        await self.database.dispose()
        log.info("gateway.stopped")
