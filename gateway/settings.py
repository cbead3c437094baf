"""The configuration schema: frozen, validated pydantic models, one per config section.

Every field has a default, so ``GatewayConfig()`` (an empty file) is the embedded configuration
that ``make run`` uses. Unknown keys are rejected and the cross-field rules "fail closed": an
enabled channel without the secret that authenticates its traffic refuses to load, with an
error located at the missing key (``channels.slack.signing_secret``), not at its section.

The value types live in `primitives.config_types`; each channel's section lives in its
subpackage (`channels/<type>/config.py`) and `ChannelsConfig` is assembled from the channel
registry, so a new channel brings its section with it. The identity sections (organizations,
users, provisioning) live in `gateway.identity_settings` and are exported from here with the
others.

Loading a file, substituting ``${VAR}`` references and turning validation errors into
``FILE:LINE: key.path: message`` lines is the job of `gateway.config`; this module knows
nothing about files.

Two conventions keep errors located at the key that is wrong:

* Cross-field rules are field validators that read the fields validated *before* them
  (``info.data``), so the order of fields in a class matters: a field a rule depends on is
  declared above the field that carries the rule. ``validate_default=True`` makes those rules
  run when the checked key is absent from the file.
* A rule about a key inside a nested value (``s3.bucket``, ``users[2].id``) raises a
  `pydantic.ValidationError` whose locations are relative to the validated field; pydantic
  prefixes the field's own location, so the error lands on the exact key.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationInfo,
    create_model,
    field_validator,
)

from channels.registry import channel_plugins
from gateway.identity_settings import (
    IdentityConfig,
    OrganizationConfig,
    ProvisionConfig,
    UserConfig,
)
from gateway.tools_settings import McpServerConfig, ToolPolicyRuleConfig, ToolsConfig
from primitives.config_types import (
    Duration,
    Loc,
    OptionalStr,
    Port,
    StrictModel,
    empty_to_none,
    is_blank,
    located_errors,
    parse_duration,
    rule_error,
)

__all__ = [
    "ChannelsConfig",
    "CompactionConfig",
    "Duration",
    "GatewayConfig",
    "IdentityConfig",
    "LLMConfig",
    "LoggingConfig",
    "McpServerConfig",
    "OrganizationConfig",
    "ProvisionConfig",
    "RecallConfig",
    "S3Config",
    "ServerConfig",
    "SessionsConfig",
    "StorageConfig",
    "StrictModel",
    "ToolPolicyRuleConfig",
    "ToolsConfig",
    "TranscriptsConfig",
    "UserConfig",
    "parse_duration",
]


class ServerConfig(StrictModel):
    """The HTTP listener that serves the web channel, the Slack and Teams webhooks, health and
    metrics."""

    host: str = "127.0.0.1"
    port: Port = 8080
    # Where users reach this server (e.g. https://assistant.example.com): makes links absolute.
    public_url: OptionalStr = None
    # Processes that run turns beside the one that serves HTTP and email (PostgreSQL only).
    # 0: this process accepts and runs turns; N: it only accepts (acknowledgements never wait
    # behind turns) and starts N turn workers, woken by PostgreSQL notifications.
    turn_workers: Annotated[int, Field(ge=0, le=32)] = 0


class LoggingConfig(StrictModel):
    """Structured logging: JSON lines in production, coloured console output for development."""

    format: Literal["json", "console"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"


class S3Config(StrictModel):
    """The S3 bucket for transcripts and archives (used when ``backend: s3``)."""

    bucket: OptionalStr = None
    prefix: str = ""
    region: OptionalStr = None
    endpoint_url: OptionalStr = None
    sse: Annotated[Literal["AES256", "aws:kms"] | None, BeforeValidator(empty_to_none)] = None
    kms_key_id: OptionalStr = None

    @field_validator("kms_key_id")
    @classmethod
    def _kms_key_needs_kms_encryption(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A KMS key with another encryption mode would be silently ignored."""
        if value is not None and info.data.get("sse") != "aws:kms":
            raise rule_error("only used with sse: aws:kms")
        return value


class TranscriptsConfig(StrictModel):
    """Where full transcripts and pre-compaction archives are written."""

    backend: Literal["local", "s3"] = "local"
    local_path: Path = Path("./var/transcripts")
    s3: S3Config = Field(default_factory=S3Config)

    @field_validator("s3")
    @classmethod
    def _s3_backend_needs_bucket(cls, value: S3Config, info: ValidationInfo) -> S3Config:
        """Without a bucket the S3 store could not archive anything."""
        if info.data.get("backend") == "s3" and value.bucket is None:
            raise located_errors(
                "S3Config",
                [(("bucket",), "required when storage.transcripts.backend is s3", None)],
            )
        return value


class StorageConfig(StrictModel):
    """The database (SQLite or PostgreSQL) and the transcript store."""

    database_url: str = "sqlite+aiosqlite:///./var/gateway.db"
    auto_migrate: bool = True
    pool_size: int = Field(default=10, ge=1)
    transcripts: TranscriptsConfig = Field(default_factory=TranscriptsConfig)
    # How long a reply a process took for sending stays its own: if the process dies, another
    # sends it after this long (asking Slack first what it already holds). Longer than the
    # slowest send (the platforms' clients give up after 30 s).
    reply_lease: Duration = timedelta(seconds=120)

    @field_validator("reply_lease")
    @classmethod
    def _lease_outlasts_a_send(cls, value: timedelta) -> timedelta:
        """A lease shorter than a send would hand a reply to a second sender mid-send."""
        if value < timedelta(seconds=10):
            raise rule_error("must be at least 10s")
        return value

    @field_validator("database_url")
    @classmethod
    def _async_driver_only(cls, value: str) -> str:
        """The gateway is async throughout, so only the async drivers are accepted."""
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+psycopg://")):
            raise rule_error(
                "must start with sqlite+aiosqlite:// or postgresql+psycopg://",
            )
        return value


class LLMConfig(StrictModel):
    """The language model: ``offline`` answers locally without any network access."""

    # auto: anthropic when an api_key is set, else offline.
    provider: Literal["auto", "offline", "anthropic", "bedrock", "vertex"] = "auto"
    model: str = "claude-sonnet-5-5"
    api_key: SecretStr = SecretStr("")
    base_url: OptionalStr = None
    system_prompt: str = "You are a helpful assistant."
    timeout: Duration = timedelta(seconds=60)
    max_retries: int = Field(default=4, ge=0)
    max_tokens: int = Field(default=4096, ge=1)
    # Bedrock / Vertex: the cloud region, and (Vertex) the project id.
    region: OptionalStr = None
    project_id: OptionalStr = None
    # Simulated thinking time of the offline provider (demos, load and crash tests).
    offline_latency: Duration | None = None
    # The offline provider's pace when it streams its answer word by word (demos, benchmarks).
    offline_token_interval: Duration | None = None

    @field_validator("api_key")
    @classmethod
    def _anthropic_needs_api_key(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        """Fail at start-up rather than on the first message."""
        if info.data.get("provider") == "anthropic" and is_blank(value):
            raise rule_error("required when llm.provider is anthropic")
        return value


class StatusTextsConfig(StrictModel):
    """What a live reply says while the assistant works (`{detail}`: a tool's or file's name)."""

    thinking: str = "Thinking…"
    compacting: str = "Summarising older messages to make room…"
    searching: str = "Searching earlier conversations…"
    reading: str = "Reading {detail}…"
    tool: str = "Using {detail}…"

    @field_validator("thinking", "compacting", "searching", "reading", "tool")
    @classmethod
    def _only_detail_placeholder(cls, value: str) -> str:
        """A status is one short line; `{detail}` is the only placeholder."""
        if not value.strip() or "\n" in value or len(value) > 150:
            raise rule_error("must be one non-empty line of at most 150 characters")
        if "{" in value.replace("{detail}", "") or "}" in value.replace("{detail}", ""):
            raise rule_error("the only placeholder is {detail}")
        return value


class LiveConfig(StrictModel):
    """Replies shown while they are written, on the channels whose `streaming` is on."""

    status: StatusTextsConfig = Field(default_factory=StatusTextsConfig)


class CompactionConfig(StrictModel):
    """When a session's context is compacted and how much of it is kept verbatim."""

    trigger_ratio: float = Field(default=0.8, gt=0, le=1)
    max_messages: int = Field(default=200, ge=1)
    keep_last_messages: int = Field(default=20, ge=0)
    summary_max_tokens: int = Field(default=2000, ge=1)

    @field_validator("keep_last_messages")
    @classmethod
    def _keep_fewer_than_max(cls, value: int, info: ValidationInfo) -> int:
        """Keeping all messages would make compaction a no-op that triggers on every turn."""
        max_messages = info.data.get("max_messages")
        if max_messages is not None and value >= max_messages:
            raise rule_error(
                f"must be less than sessions.compaction.max_messages ({max_messages})",
            )
        return value


class SessionsConfig(StrictModel):
    """Session scope, idle archiving, the context budget and compaction."""

    scope: Literal["user", "channel"] = "user"
    archive_after: Duration = timedelta(hours=24)
    suggest_new_after: Duration = timedelta(hours=8)
    history_budget_tokens: int = Field(default=50_000, gt=0)
    max_concurrent_turns: int = Field(default=256, ge=1)
    topic_every_messages: int = Field(default=5, ge=1)
    summary_min_user_messages: int = Field(default=5, ge=1)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)


class RecallConfig(StrictModel):
    """Recall: what was said in earlier sessions, found by search and used in turns.

    Every turn and summary is indexed in the database whatever these say; they decide how
    turns use the index.
    """

    enabled: bool = True
    auto_hits: int = Field(default=5, ge=0)
    auto_context_tokens: int = Field(default=600, ge=0)
    tool: bool = True
    resume_by_reference: bool = False
    # Dense recall: passages found by meaning as well as by words (an embedding model that
    # ships with the gateway's packages); without the model installed, it stays off.
    dense: bool = True


class FilesConfig(StrictModel):
    """Files people send with their messages: the assistant reads them within these limits;
    a file over them gets a sentence in the reply instead."""

    enabled: bool = True
    # One file, in megabytes (the Messages API takes PDFs of up to 32 MB per request).
    max_file_mb: int = Field(default=25, ge=1, le=500)
    # All the files of one message together, in megabytes.
    max_message_mb: int = Field(default=50, ge=1, le=1000)
    # Files read per message; the rest are named in the reply as not read.
    max_files_per_message: int = Field(default=10, ge=1, le=100)


class RetentionConfig(StrictModel):
    """How long archived sessions are kept."""

    # Archived sessions inactive for longer are deleted by a background job; None keeps them.
    delete_after_days: int | None = Field(default=None, ge=1)


class AdminConfig(StrictModel):
    """The admin HTTP API under ``/admin/v1/``."""

    # Bearer token of the API; empty disables the API.
    token: SecretStr = SecretStr("")


class ChannelSections(StrictModel):
    """The channels people use to reach the assistant: one section per registered channel
    (`channels.registry`), read with `section`."""

    def section(self, channel_type: str) -> BaseModel:
        """The config section of one channel type."""
        value: BaseModel = getattr(self, channel_type)
        return value


if TYPE_CHECKING:
    ChannelsConfig = ChannelSections
else:
    ChannelsConfig = create_model(
        "ChannelsConfig",
        __base__=ChannelSections,
        __doc__=ChannelSections.__doc__,
        **{
            plugin.name: (plugin.config_model, Field(default_factory=plugin.config_model))
            for plugin in channel_plugins()
        },
    )


class GatewayConfig(StrictModel):
    """The whole configuration. ``GatewayConfig()`` is the embedded default configuration.

    The sections are declared in dependency order: users refer to organizations and web
    tokens refer to users, and those rules read the sections validated before them.
    """

    server: ServerConfig = Field(default_factory=ServerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    recall: RecallConfig = Field(default_factory=RecallConfig)
    live: LiveConfig = Field(default_factory=LiveConfig)
    files: FilesConfig = Field(default_factory=FilesConfig)
    organizations: tuple[OrganizationConfig, ...] = ()
    identity: IdentityConfig = Field(default_factory=IdentityConfig)
    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)

    @field_validator("organizations")
    @classmethod
    def _organization_ids_unique(
        cls, organizations: tuple[OrganizationConfig, ...]
    ) -> tuple[OrganizationConfig, ...]:
        """Two organizations with one id would share a transcript folder."""
        errors: list[tuple[Loc, str, object]] = []
        first_index: dict[str, int] = {}
        for index, organization in enumerate(organizations):
            first = first_index.setdefault(organization.id, index)
            if first != index:
                message = (
                    f"duplicate organization id {organization.id!r} (also organizations[{first}])"
                )
                errors.append(((index, "id"), message, organization.id))
        if errors:
            raise located_errors("GatewayConfig", errors)
        return organizations

    @field_validator("storage")
    @classmethod
    def _turn_workers_need_postgresql(
        cls, storage: StorageConfig, info: ValidationInfo
    ) -> StorageConfig:
        """Turn workers are processes of their own; SQLite serves one process."""
        server: ServerConfig | None = info.data.get("server")
        if server is not None and server.turn_workers and storage.database_url.startswith("sqlite"):
            message = "server.turn_workers needs PostgreSQL (SQLite serves one process)"
            raise located_errors("StorageConfig", [(("database_url",), message, None)])
        return storage

    @field_validator("identity")
    @classmethod
    def _users_belong_to_configured_organizations(
        cls, identity: IdentityConfig, info: ValidationInfo
    ) -> IdentityConfig:
        """Once organizations are configured, every user must belong to one of them."""
        organizations: tuple[OrganizationConfig, ...] = info.data.get("organizations", ())
        if not organizations:
            return identity
        known = sorted(organization.id for organization in organizations)
        errors: list[tuple[Loc, str, object]] = []
        for index, user in enumerate(identity.users):
            if user.org is None:
                message = f"required when organizations are configured (one of: {', '.join(known)})"
                errors.append((("users", index, "org"), message, None))
            elif user.org not in known:
                message = f"unknown organization {user.org!r} (configured: {', '.join(known)})"
                errors.append((("users", index, "org"), message, user.org))
        if errors:
            raise located_errors("IdentityConfig", errors)
        return identity

    @field_validator("channels")
    @classmethod
    def _channel_rules(cls, channels: ChannelSections, info: ValidationInfo) -> ChannelSections:
        """Each channel's rules that read other sections (web tokens name configured users)."""
        if info.data.get("identity") is None or info.data.get("server") is None:
            return channels  # a section they read is itself invalid and already reported
        config = SimpleNamespace(**info.data)
        errors: list[tuple[Loc, str, object]] = []
        for plugin in channel_plugins():
            if plugin.check is not None:
                problems = plugin.check(channels.section(plugin.name), config)
                errors.extend(((plugin.name, *where), what, got) for where, what, got in problems)
        if errors:
            raise located_errors("ChannelsConfig", errors)
        return channels
