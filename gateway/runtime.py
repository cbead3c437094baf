"""The running gateway's services, wired from the config, opened at start-up, closed at shutdown.

Start-up fails closed: an unreachable database, a failed migration or an unusable transcript
store raises a `GatewayError` naming the problem before the HTTP server accepts a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from channels.base import ChannelAdapter, ChannelType
from channels.web.adapter import WebChannel, WebSettings
from gateway.admin import Administration
from gateway.channel_factories import listen_for_email, open_email, open_slack, open_teams
from gateway.dispatcher import Dispatcher
from gateway.exports import SessionExports
from gateway.identity import IdentityResolver, sync_identities
from gateway.inbox import Inbox
from gateway.jobs import BackgroundJobs
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.outbox import OutboxFeed, OutboxSender
from gateway.settings import GatewayConfig, TranscriptsConfig
from gateway.turns import TurnProcessor, TurnSettings
from gateway.work_slots import WORK_SLOTS, WaitingLLM, WorkSlots
from sessions.anthropic_llm import AnthropicLLM, AnthropicSettings
from sessions.compaction import CompactionPolicy, Compactor
from sessions.engine import EngineSettings, RecallSettings, SessionEngine
from sessions.llm import OFFLINE_LABEL, LLMClient, OfflineLLM
from sessions.recall import RecallSearch
from sessions.recall_reference import session_referenced
from sessions.routing import RoutingPolicy
from sessions.turn import TurnService
from storage.database import Database
from storage.inbox_signal import InboxListener, InboxNotifier
from storage.local_transcripts import LocalTranscriptStore
from storage.locks import TurnLocks, turn_locks_for
from storage.models import utcnow
from storage.repositories.admin import AdminRepository
from storage.repositories.outbox import OutboxRepository
from storage.transcripts import TranscriptStore

if TYPE_CHECKING:
    from channels.email.adapter import EmailChannel
    from channels.slack.adapter import SlackChannel
    from channels.teams.adapter import TeamsChannel

log = get_logger(__name__)

Role = Literal["all", "accept", "turns"]


def open_transcript_store(settings: TranscriptsConfig) -> TranscriptStore:
    """The transcript store the config asks for (local folder or S3)."""
    if settings.backend == "s3":
        # boto3 takes half a second to import; only S3 deployments pay for it.
        from storage.s3_transcripts import S3TranscriptStore  # noqa: PLC0415

        s3 = settings.s3
        if s3.bucket is None:  # the config schema already refuses this; keep mypy honest
            raise ValueError("storage.transcripts.s3.bucket is required for backend s3")
        return S3TranscriptStore(
            s3.bucket,
            s3.prefix,
            region=s3.region,
            endpoint_url=s3.endpoint_url,
            sse=s3.sse,
            kms_key_id=s3.kms_key_id,
        )
    return LocalTranscriptStore(settings.local_path)


def open_llm(config: GatewayConfig) -> LLMClient:
    """The language model client the config asks for (`auto`: Claude when a key is set)."""
    llm = config.llm
    api_key = llm.api_key.get_secret_value()
    provider = llm.provider
    if provider == "auto":
        provider = "anthropic" if api_key else "offline"
    if provider == "offline":
        log.warning("llm.offline", detail=OFFLINE_LABEL)
        latency = llm.offline_latency
        return OfflineLLM(latency=latency.total_seconds() if latency else 0.0)
    log.info("llm.configured", provider=provider, model=llm.model, base_url=llm.base_url)
    return AnthropicLLM(
        AnthropicSettings(
            provider=provider,
            model=llm.model,
            api_key=api_key,
            base_url=llm.base_url,
            timeout_seconds=llm.timeout.total_seconds(),
            max_retries=llm.max_retries,
            region=llm.region,
            project_id=llm.project_id,
        )
    )


def open_engine(
    config: GatewayConfig,
    database: Database,
    transcripts: TranscriptStore,
    llm: LLMClient,
    clock: Callable[[], datetime],
    *,
    on_archive_failed: Callable[[], None] | None = None,
) -> SessionEngine:
    """The session engine with the config's budget, compaction and summary settings."""
    sessions = config.sessions
    policy = CompactionPolicy(
        budget_tokens=sessions.history_budget_tokens,
        trigger_ratio=sessions.compaction.trigger_ratio,
        max_messages=sessions.compaction.max_messages,
        keep_last_messages=sessions.compaction.keep_last_messages,
        summary_max_tokens=sessions.compaction.summary_max_tokens,
    )
    return SessionEngine(
        database,
        Compactor(
            database,
            transcripts,
            llm,
            policy,
            clock=clock,
            on_archive_failed=on_archive_failed,
        ),
        llm,
        EngineSettings(
            system_prompt=config.llm.system_prompt,
            max_tokens=config.llm.max_tokens,
            compaction=policy,
            topic_every_messages=sessions.topic_every_messages,
            suggest_new_after=sessions.suggest_new_after,
            summary_min_user_messages=sessions.summary_min_user_messages,
        ),
        clock=clock,
        recall=RecallSettings(
            auto_hits=config.recall.auto_hits,
            auto_context_tokens=config.recall.auto_context_tokens,
            tool=config.recall.tool,
        )
        if config.recall.enabled
        else None,
    )


def _reference_finder(database: Database) -> Callable[[str, str], Awaitable[str | None]]:
    search = RecallSearch(database)

    async def find(user_id: str, text: str) -> str | None:
        return await session_referenced(search, user_id, text)

    return find


@dataclass
class GatewayRuntime:
    """Everything request handlers and background loops need, wired from the config."""

    config: GatewayConfig
    database: Database
    transcripts: TranscriptStore
    metrics: GatewayMetrics
    clock: Callable[[], datetime]
    inbox: Inbox
    engine: SessionEngine
    dispatcher: Dispatcher
    outbox: OutboxSender
    jobs: BackgroundJobs
    locks: TurnLocks
    admin: Administration
    web: WebChannel | None
    slack: SlackChannel | None = None
    teams: TeamsChannel | None = None
    email: EmailChannel | None = None
    # all: accept and run turns; accept: only accept (turn workers run them); turns: a turn
    # worker (no HTTP, no email listener, no migrations).
    role: Role = "all"
    notifier: InboxNotifier | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def start(
        cls, config: GatewayConfig, *, clock: Callable[[], datetime] = utcnow, role: Role = "all"
    ) -> GatewayRuntime:
        """Open the database (migrating it when `storage.auto_migrate`), the store, the users.

        A turn worker (`role="turns"`) leaves migrations and the users to the process that
        started it, and listens on no port.
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
            transcripts = open_transcript_store(config.storage.transcripts)
            await transcripts.check()
            if role != "turns":
                await sync_identities(database, config)
        except BaseException:
            await database.dispose()
            raise
        runtime = cls._wire(config, database, transcripts, clock, role)
        try:
            if runtime.slack is not None and role != "turns":
                await runtime.slack.start()
            if runtime.email is not None and role != "turns":
                await listen_for_email(runtime.email, config)
        except BaseException:
            await runtime.close()
            raise
        log.info(
            "gateway.started",
            database=database.display_url,
            transcripts=config.storage.transcripts.backend,
            llm_provider=config.llm.provider,
            channels=sorted(runtime.outbox.adapters),
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
    ) -> GatewayRuntime:
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
        outbox = OutboxSender(database, adapters, metrics, clock=clock)
        work_slots = WorkSlots()
        engine = open_engine(
            config,
            database,
            transcripts,
            WaitingLLM(open_llm(config), work_slots),
            clock,
            on_archive_failed=metrics.archive_failures.inc,
        )
        routing = RoutingPolicy(config.sessions.scope, config.sessions.archive_after)
        service = TurnService(
            database,
            engine,
            transcripts,
            routing,
            clock=clock,
            reply_lease=outbox.policy.lease,
            find_referenced=_reference_finder(database)
            if config.recall.resume_by_reference
            else None,
            waiting=work_slots.waiting,
        )
        processor = TurnProcessor(
            database,
            service,
            transcripts,
            metrics,
            TurnSettings(
                routing=routing,
                history_budget_tokens=config.sessions.history_budget_tokens,
                pull_channels=frozenset({ChannelType.WEB.value}),
                public_url=config.server.public_url or "",
            ),
            clock=clock,
            send_reply=outbox.send_now,
            reply_lease=outbox.policy.lease,
            work_slots=work_slots,
        )
        # The dispatcher is built below (it needs the Slack channel's email lookup); the
        # inbox reaches it when the first message arrives.
        # Accepting only, the turn workers hear of new messages by notification.
        notifier = InboxNotifier(database.url) if role == "accept" else None
        inbox = Inbox(
            database,
            metrics,
            clock=clock,
            on_accept=notifier.publish
            if notifier is not None
            else lambda key: dispatcher.notify(key),  # noqa: PLW0108 (bound later)
        )
        slack = open_slack(config, inbox, database, metrics)
        if slack is not None:
            adapters[ChannelType.SLACK] = slack
        email = open_email(config, inbox, database, metrics, clock)
        if email is not None:
            adapters[ChannelType.EMAIL] = email
        teams = open_teams(config, inbox, metrics, clock)
        if teams is not None:
            adapters[ChannelType.TEAMS] = teams
        email_lookups = {ChannelType.SLACK.value: slack.email_of} if slack is not None else {}
        dispatcher = Dispatcher(
            database,
            IdentityResolver(database, config, email_lookups=email_lookups),
            locks,
            processor,
            max_concurrent_turns=config.sessions.max_concurrent_turns,
        )
        web = None
        if config.channels.web.enabled:
            web_config = config.channels.web
            web = WebChannel(
                WebSettings(
                    dev_open=web_config.dev_open,
                    tokens={t.token.get_secret_value(): t.user for t in web_config.tokens},
                    max_text_chars=web_config.max_text_chars,
                ),
                inbox,
                OutboxFeed(database),
                SessionExports(database, clock),
                clock=clock,
                on_rejected=lambda status, _reason: metrics.messages_rejected.labels(
                    "web", str(status)
                ).inc(),
            )
            adapters[ChannelType.WEB] = web
        admin = Administration(database, transcripts, clock)
        retention_days = config.retention.delete_after_days
        jobs = BackgroundJobs(
            database,
            locks,
            engine,
            archive_after=config.sessions.archive_after,
            clock=clock,
            admin=admin,
            delete_after=timedelta(days=retention_days) if retention_days else None,
        )
        return cls(
            config=config,
            database=database,
            transcripts=transcripts,
            metrics=metrics,
            clock=clock,
            inbox=inbox,
            engine=engine,
            dispatcher=dispatcher,
            outbox=outbox,
            jobs=jobs,
            locks=locks,
            web=web,
            slack=slack,
            teams=teams,
            email=email,
            admin=admin,
            role=role,
            notifier=notifier,
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
        that only accepts); a turn worker also listens for the accepting process's news."""
        if self.role == "accept":
            return
        loops: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
            ("dispatcher", self.dispatcher.run),
            ("outbox", self.outbox.run),
            ("jobs", self.jobs.run),
        ]
        if self.role == "turns":
            listener = InboxListener(self.database.url, self.dispatcher.notify)
            loops.append(("inbox-listener", listener.run))
        for name, loop in loops:
            self._tasks.append(asyncio.create_task(loop(), name=name))

    async def close(self) -> None:
        """Stop the loops (turns in flight finish; unfinished work stays in the database)."""
        if self.slack is not None:
            await self.slack.close()
        if self.teams is not None:
            await self.teams.close()
        if self.email is not None:
            await self.email.stop()
        await self.dispatcher.stop()
        self.outbox.stop()
        self.jobs.stop()
        for task in self._tasks:
            if task.get_name() == "inbox-listener":
                task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.notifier is not None:
            await self.notifier.close()
        await self.locks.close()
        await self.engine.llm.close()
        await self.database.dispose()
        log.info("gateway.stopped")
