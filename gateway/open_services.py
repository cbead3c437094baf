"""The services the config asks for, each opened by one function: the transcript store, the
language model, the session engine and the finder of referred sessions. `GatewayRuntime`
wires them together; `gateway doctor`, the admin commands, reload and the benchmarks open
the one they need."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from gateway.log import get_logger
from gateway.runtime_settings import RuntimeSettings, runtime_settings
from gateway.settings import GatewayConfig, TranscriptsConfig
from sessions.compaction import Compactor
from sessions.engine import SessionEngine
from sessions.llm import OFFLINE_LABEL, LLMClient, OfflineLLM
from sessions.recall import RecallSearch
from sessions.recall_embedding import installed_embedder
from sessions.recall_reference import session_referenced
from sessions.toolbox import McpToolbox
from storage.database import Database
from storage.local_transcripts import LocalTranscriptStore
from storage.transcripts import TranscriptStore

log = get_logger(__name__)


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
        latency, pace = llm.offline_latency, llm.offline_token_interval
        return OfflineLLM(
            latency=latency.total_seconds() if latency else 0.0,
            token_interval=pace.total_seconds() if pace else 0.0,
        )
    log.info("llm.configured", provider=provider, model=llm.model, base_url=llm.base_url)
    # Imported only when used: the SDK takes seconds to import, which a gateway on the
    # offline model (development, tests) need not pay at every start.
    from sessions.anthropic_llm import AnthropicLLM, AnthropicSettings  # noqa: PLC0415

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
    settings: RuntimeSettings | None = None,
    toolbox: McpToolbox | None = None,
) -> SessionEngine:
    """The session engine with the config's budget, compaction, summary and recall settings."""
    settings = settings or runtime_settings(config)
    return SessionEngine(
        database,
        Compactor(
            database,
            transcripts,
            llm,
            settings.engine.compaction,
            clock=clock,
            on_archive_failed=on_archive_failed,
        ),
        llm,
        settings.engine,
        clock=clock,
        recall=settings.recall,
        toolbox=toolbox,
        embedder=installed_embedder(),
    )


def reference_finder(database: Database) -> Callable[[str, str], Awaitable[str | None]]:
    """Finds the archived session a message refers to (`recall.resume_by_reference`)."""
    search = RecallSearch(database)

    async def find(user_id: str, text: str) -> str | None:
        return await session_referenced(search, user_id, text)

    return find
