"""The running gateway's shared services, opened once at start-up and closed at shutdown.

Start-up fails closed: an unreachable database, a failed migration or an unusable transcript
store raises a `GatewayError` naming the problem before the HTTP server accepts a request.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewayConfig, TranscriptsConfig
from storage.database import Database
from storage.transcripts import LocalTranscriptStore, TranscriptStore

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


@dataclass
class GatewayRuntime:
    """Everything a request handler or background job needs, wired from the config."""

    config: GatewayConfig
    database: Database
    transcripts: TranscriptStore
    metrics: GatewayMetrics

    @classmethod
    async def start(cls, config: GatewayConfig) -> GatewayRuntime:
        """Open the database (migrating it when `storage.auto_migrate`) and the store."""
        database = Database(config.storage.database_url, pool_size=config.storage.pool_size)
        try:
            await database.ping()
            if config.storage.auto_migrate:
                await database.upgrade()
                log.info("storage.migrated", revision=await database.current_revision())
            transcripts = open_transcript_store(config.storage.transcripts)
            await transcripts.check()
        except BaseException:
            await database.dispose()
            raise
        metrics = GatewayMetrics()
        metrics.info.info(
            {
                "database": database.url.get_backend_name(),
                "transcripts": config.storage.transcripts.backend,
                "llm_provider": config.llm.provider,
            }
        )
        log.info(
            "gateway.started",
            database=database.display_url,
            transcripts=config.storage.transcripts.backend,
            llm_provider=config.llm.provider,
        )
        return cls(config=config, database=database, transcripts=transcripts, metrics=metrics)

    async def close(self) -> None:
        """Release connections; safe to call once at shutdown."""
        await self.database.dispose()
        log.info("gateway.stopped")
