"""The configuration schema: frozen, validated pydantic models, one per config section.

Every field has a default, so ``GatewayConfig()`` (an empty file) is the embedded configuration
that ``make run`` uses. Unknown keys are rejected and the cross-field rules "fail closed": an
enabled channel without the secret that authenticates its traffic refuses to load, with an
error located at the missing key (``channels.slack.signing_secret``), not at its section.

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

import ipaddress
import re
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

__all__ = [
    "ChannelsConfig",
    "CompactionConfig",
    "Duration",
    "EmailAuthConfig",
    "EmailChannelConfig",
    "EmailOutboundConfig",
    "GatewayConfig",
    "IdentityConfig",
    "LLMConfig",
    "LoggingConfig",
    "OrganizationConfig",
    "ProvisionConfig",
    "RecallConfig",
    "S3Config",
    "ServerConfig",
    "SessionsConfig",
    "SlackChannelConfig",
    "StorageConfig",
    "StrictModel",
    "TeamsChannelConfig",
    "TranscriptsConfig",
    "UserConfig",
    "WebChannelConfig",
    "WebToken",
    "parse_duration",
]

RULE_ERROR_TYPE = "config_rule"
"""The pydantic error type of every rule in this module (a readable message, no prefix)."""

_Loc = tuple[str | int, ...]


def _rule_error(message: str) -> PydanticCustomError:
    """A validation error whose message is shown as is (no "Value error, " prefix)."""
    return PydanticCustomError(RULE_ERROR_TYPE, message)


def _located_errors(title: str, errors: Iterable[tuple[_Loc, str, object]]) -> ValidationError:
    """Bundle ``(location, message, input)`` triples into one `ValidationError`.

    Raised from a field validator, the locations are relative to that field, so a rule on a
    list can point at ``users[3].id`` and report every offending item at once.
    """
    details = [
        InitErrorDetails(type=_rule_error(message), loc=loc, input=value)
        for loc, message, value in errors
    ]
    return ValidationError.from_exception_data(title, details)


# --- value types ---------------------------------------------------------------------------

_DURATION_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
}
# "ms" is listed before "m" and "s" so that "500ms" is not read as 500 minutes and an "s".
_DURATION_PART = r"(\d+(?:\.\d+)?)(ms|s|m|h|d)"
_DURATION_RE = re.compile(rf"(?:{_DURATION_PART})+")
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")


def parse_duration(value: object) -> timedelta:
    """Read a duration: ``"24h"``, ``"30m"``, ``"90s"``, ``"7d"``, ``"1h30m"``, ``"500ms"``.

    A plain number (or a numeric string) counts as seconds; a `timedelta` passes through. The
    result must be greater than zero. Anything else raises a pydantic error that says what a
    valid duration looks like.
    """
    try:
        if isinstance(value, timedelta):
            result = value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            result = timedelta(seconds=value)
        elif isinstance(value, str) and _NUMBER_RE.fullmatch(value.strip()):
            result = timedelta(seconds=float(value.strip()))
        elif isinstance(value, str) and _DURATION_RE.fullmatch(value.strip()):
            parts = re.findall(_DURATION_PART, value.strip())
            result = sum(
                (float(amount) * _DURATION_UNITS[unit] for amount, unit in parts), timedelta()
            )
        else:
            raise _rule_error(
                f"invalid duration {value!r}: use a number with s, m, h or d, e.g. 30m",
            )
    except OverflowError as exc:
        raise _rule_error(f"invalid duration: {str(value)[:40]!r} is too long") from exc
    if result <= timedelta():
        raise _rule_error(f"invalid duration {value!r}: must be greater than zero")
    return result


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
"""A `timedelta` written as ``"24h"``, ``"1h30m"``, ``"500ms"`` or a number of seconds."""


def _empty_to_none(value: object) -> object:
    """Treat ``""`` as "not set", so ``${VAR:-}`` can leave an optional key unset."""
    return None if value == "" else value


OptionalStr = Annotated[str | None, BeforeValidator(_empty_to_none)]
"""An optional string where an empty string means "not set"."""

_IDENTIFIER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _check_identifier(value: str) -> str:
    """Ids become path segments in the transcript store, so they must be path-safe."""
    if not _IDENTIFIER_RE.fullmatch(value):
        raise _rule_error(
            f"invalid id {value!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
        )
    return value


Identifier = Annotated[str, AfterValidator(_check_identifier)]
"""An organization or user id: safe to use as a path segment and in URLs."""

_SLACK_IDENTITY_RE = re.compile(r"[A-Za-z0-9]+:[A-Za-z0-9]+")


def _check_slack_identity(value: str) -> str:
    """A Slack user is only unique within its workspace, so both ids are required."""
    if not _SLACK_IDENTITY_RE.fullmatch(value):
        raise _rule_error(f"invalid Slack identity {value!r}: use TEAM:USER, e.g. T0001:U0001")
    return value


SlackIdentity = Annotated[str, AfterValidator(_check_slack_identity)]
"""A Slack user written as ``TEAM_ID:USER_ID``."""

_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def _check_email(value: str) -> str:
    """Catch obvious typos; deliverability is the mail server's business."""
    if not _EMAIL_RE.fullmatch(value):
        raise _rule_error(f"invalid email address {value!r}")
    return value


EmailAddress = Annotated[str, AfterValidator(_check_email)]
"""An email address of the plain ``local@domain.tld`` form."""

NonEmptyStr = Annotated[str, Field(min_length=1)]
"""A string that must not be empty."""

Port = Annotated[int, Field(ge=1, le=65535)]
"""A TCP port number."""


def _off_from_false(value: object) -> object:
    """YAML 1.1 reads a bare ``off`` as ``False``; take it to mean the string ``"off"``."""
    return "off" if value is False else value


def _is_blank(secret: SecretStr | str) -> bool:
    """True when a secret or string is empty or only whitespace."""
    text = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    return not text.strip()


# --- models --------------------------------------------------------------------------------


class StrictModel(BaseModel):
    """Base of every config model: immutable, unknown keys rejected, defaults validated.

    Defaults are validated so that a cross-field rule on a key also runs when the key is
    missing from the file (an enabled Slack channel without any ``signing_secret`` line).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


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
    sse: Annotated[Literal["AES256", "aws:kms"] | None, BeforeValidator(_empty_to_none)] = None
    kms_key_id: OptionalStr = None

    @field_validator("kms_key_id")
    @classmethod
    def _kms_key_needs_kms_encryption(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A KMS key with another encryption mode would be silently ignored."""
        if value is not None and info.data.get("sse") != "aws:kms":
            raise _rule_error("only used with sse: aws:kms")
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
            raise _located_errors(
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

    @field_validator("database_url")
    @classmethod
    def _async_driver_only(cls, value: str) -> str:
        """The gateway is async throughout, so only the async drivers are accepted."""
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+psycopg://")):
            raise _rule_error(
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

    @field_validator("api_key")
    @classmethod
    def _anthropic_needs_api_key(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        """Fail at start-up rather than on the first message."""
        if info.data.get("provider") == "anthropic" and _is_blank(value):
            raise _rule_error("required when llm.provider is anthropic")
        return value


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
            raise _rule_error(
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


class OrganizationConfig(StrictModel):
    """An organization; its ``context`` is added to the system prompt of its users."""

    id: Identifier
    name: str = ""
    context: str = ""


class ProvisionConfig(StrictModel):
    """Who may be provisioned automatically when ``unknown_users: provision``."""

    slack_team_ids: tuple[NonEmptyStr, ...] = ()
    teams_tenant_ids: tuple[NonEmptyStr, ...] = ()
    email_domains: tuple[NonEmptyStr, ...] = ()


class UserConfig(StrictModel):
    """A known user and the identities that are theirs on each channel."""

    id: Identifier
    org: Identifier | None = None
    name: str = ""
    slack: tuple[SlackIdentity, ...] = ()
    teams: tuple[NonEmptyStr, ...] = ()
    email: tuple[EmailAddress, ...] = ()
    admin: bool = False


class IdentityConfig(StrictModel):
    """How senders are mapped to users, and what happens to senders nobody configured."""

    unknown_users: Literal["reject", "provision"] = "reject"
    link_by_email: bool = False
    provision: ProvisionConfig = Field(default_factory=ProvisionConfig)
    users: tuple[UserConfig, ...] = ()

    @field_validator("users")
    @classmethod
    def _ids_and_identities_unique(cls, users: tuple[UserConfig, ...]) -> tuple[UserConfig, ...]:
        """An id or a channel identity belonging to two users would make routing ambiguous."""
        errors: list[tuple[_Loc, str, object]] = []
        first_index: dict[str, int] = {}
        owner: dict[tuple[str, str], str] = {}
        for index, user in enumerate(users):
            if user.id in first_index:
                message = f"duplicate user id {user.id!r} (also users[{first_index[user.id]}])"
                errors.append(((index, "id"), message, user.id))
            first_index.setdefault(user.id, index)
            identities = {
                "slack": user.slack,
                "teams": user.teams,
                "email": tuple(address.lower() for address in user.email),
            }
            for channel, values in identities.items():
                for position, value in enumerate(values):
                    other = owner.setdefault((channel, value), user.id)
                    if other != user.id:
                        message = f"{channel} identity {value!r} already belongs to user {other!r}"
                        errors.append(((index, channel, position), message, value))
        if errors:
            raise _located_errors("IdentityConfig", errors)
        return users


class WebToken(StrictModel):
    """A bearer token of the web channel and the user it authenticates."""

    token: SecretStr
    user: Identifier

    @field_validator("token")
    @classmethod
    def _token_not_empty(cls, value: SecretStr) -> SecretStr:
        """An empty token (an unset ``${VAR:-}``) would let anyone in as that user."""
        if _is_blank(value):
            raise _rule_error("must not be empty")
        return value


class WebChannelConfig(StrictModel):
    """The web channel's HTTP API; ``dev_open`` trusts the ``user`` field (development only)."""

    enabled: bool = True
    dev_open: bool = True
    tokens: tuple[WebToken, ...] = ()
    max_text_chars: int = Field(default=16_000, ge=1)

    @field_validator("tokens")
    @classmethod
    def _closed_web_needs_tokens(
        cls, tokens: tuple[WebToken, ...], info: ValidationInfo
    ) -> tuple[WebToken, ...]:
        """Without dev_open and without tokens nobody could use the channel; say so early."""
        if info.data.get("enabled") and info.data.get("dev_open") is False and not tokens:
            raise _rule_error(
                "at least one token is required when the web channel is enabled without dev_open",
            )
        seen: dict[str, int] = {}
        errors: list[tuple[_Loc, str, object]] = []
        for index, item in enumerate(tokens):
            first = seen.setdefault(item.token.get_secret_value(), index)
            if first != index:
                errors.append(((index, "token"), f"same token as tokens[{first}]", item.token))
        if errors:
            raise _located_errors("WebChannelConfig", errors)
        return tokens


class SlackChannelConfig(StrictModel):
    """The Slack app: Events API over HTTP (``http``) or Socket Mode (``socket``)."""

    enabled: bool = False
    mode: Literal["http", "socket"] = "http"
    bot_token: SecretStr = SecretStr("")
    signing_secret: SecretStr = SecretStr("")
    app_token: SecretStr = SecretStr("")
    allowed_team_ids: tuple[NonEmptyStr, ...] = ()
    api_base_url: str = "https://slack.com/api/"
    max_text_chars: int = Field(default=16_000, ge=1)

    @field_validator("bot_token")
    @classmethod
    def _enabled_needs_bot_token(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        """Every reply is posted with the bot token."""
        if info.data.get("enabled") and _is_blank(value):
            raise _rule_error("required when the Slack channel is enabled")
        return value

    @field_validator("signing_secret")
    @classmethod
    def _http_needs_signing_secret(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        """Without it, inbound events could not be verified: refuse instead of trusting them."""
        if info.data.get("enabled") and info.data.get("mode") == "http" and _is_blank(value):
            raise _rule_error("required when the Slack channel is enabled with mode http")
        return value

    @field_validator("app_token")
    @classmethod
    def _socket_needs_app_token(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        """Socket Mode connects with the app-level token."""
        if info.data.get("enabled") and info.data.get("mode") == "socket" and _is_blank(value):
            raise _rule_error("required when the Slack channel is enabled with mode socket")
        return value


class TeamsChannelConfig(StrictModel):
    """The Microsoft Teams bot (Bot Framework); inbound JWTs are verified against ``app_id``."""

    enabled: bool = False
    # Declared before the credentials because their rules read it.
    insecure_dev_mode: bool = False
    app_id: str = ""
    app_password: SecretStr = SecretStr("")
    tenant_ids: tuple[NonEmptyStr, ...] = ()
    openid_metadata_url: OptionalStr = None
    oauth_token_url: OptionalStr = None

    @field_validator("app_id")
    @classmethod
    def _enabled_needs_app_id(cls, value: str, info: ValidationInfo) -> str:
        """The JWT audience check needs the app id; skipping it is an explicit dev choice."""
        if info.data.get("enabled") and not info.data.get("insecure_dev_mode") and _is_blank(value):
            raise _rule_error(
                "required when the Teams channel is enabled (unless insecure_dev_mode: true)",
            )
        return value

    @field_validator("app_password")
    @classmethod
    def _enabled_needs_app_password(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        """Replies are sent with a token obtained with the app password."""
        if info.data.get("enabled") and not info.data.get("insecure_dev_mode") and _is_blank(value):
            raise _rule_error(
                "required when the Teams channel is enabled (unless insecure_dev_mode: true)",
            )
        return value


class EmailAuthConfig(StrictModel):
    """How inbound mail proves its sender: own DKIM/DMARC checks, a trusted MTA's
    Authentication-Results header, or not at all (``"off"``, development only)."""

    mode: Annotated[Literal["verify", "trusted_mta", "off"], BeforeValidator(_off_from_false)] = (
        "verify"
    )
    trusted_authserv_id: OptionalStr = None

    @field_validator("trusted_authserv_id")
    @classmethod
    def _trusted_mta_needs_authserv_id(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Without it, a sender could forge the Authentication-Results header themselves."""
        if info.data.get("mode") == "trusted_mta" and value is None:
            raise _rule_error("required when channels.email.auth.mode is trusted_mta")
        return value


class EmailOutboundConfig(StrictModel):
    """The SMTP server that replies are sent through."""

    host: str = "localhost"
    port: Port = 25
    starttls: bool = False
    username: str = ""
    password: SecretStr = SecretStr("")


class EmailChannelConfig(StrictModel):
    """The built-in SMTP server that receives mail for ``addresses``, and outbound delivery."""

    enabled: bool = False
    listen_host: str = "127.0.0.1"
    listen_port: Port = 2525
    addresses: tuple[EmailAddress, ...] = ("assistant@example.com",)
    max_message_bytes: int = Field(default=26_214_400, ge=1)
    auth: EmailAuthConfig = Field(default_factory=EmailAuthConfig)
    outbound: EmailOutboundConfig = Field(default_factory=EmailOutboundConfig)
    # STARTTLS for the inbound server: a PEM certificate chain and its private key.
    tls_cert: Annotated[Path | None, BeforeValidator(_empty_to_none)] = None
    tls_key: Annotated[Path | None, BeforeValidator(_empty_to_none)] = Field(
        default=None, validate_default=True
    )
    # Mails routed per sender and hour; more are deferred with 451 (0: no limit).
    replies_per_sender_per_hour: int = Field(default=30, ge=0)

    @field_validator("tls_key")
    @classmethod
    def _tls_needs_cert_and_key(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        """A certificate without its key (or the reverse) cannot start TLS."""
        if (value is None) != (info.data.get("tls_cert") is None):
            raise _rule_error("tls_cert and tls_key must be set together")
        return value

    @field_validator("addresses")
    @classmethod
    def _enabled_needs_address(
        cls, addresses: tuple[str, ...], info: ValidationInfo
    ) -> tuple[str, ...]:
        """An SMTP server that accepts no recipient would reject everything."""
        if info.data.get("enabled") and not addresses:
            raise _rule_error("at least one address is required when the email channel is enabled")
        return addresses


class RetentionConfig(StrictModel):
    """How long archived sessions are kept."""

    # Archived sessions inactive for longer are deleted by a background job; None keeps them.
    delete_after_days: int | None = Field(default=None, ge=1)


class AdminConfig(StrictModel):
    """The admin HTTP API under ``/admin/v1/``."""

    # Bearer token of the API; empty disables the API.
    token: SecretStr = SecretStr("")


class ChannelsConfig(StrictModel):
    """The channels people use to reach the assistant."""

    web: WebChannelConfig = Field(default_factory=WebChannelConfig)
    slack: SlackChannelConfig = Field(default_factory=SlackChannelConfig)
    teams: TeamsChannelConfig = Field(default_factory=TeamsChannelConfig)
    email: EmailChannelConfig = Field(default_factory=EmailChannelConfig)


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
    organizations: tuple[OrganizationConfig, ...] = ()
    identity: IdentityConfig = Field(default_factory=IdentityConfig)
    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)

    @field_validator("organizations")
    @classmethod
    def _organization_ids_unique(
        cls, organizations: tuple[OrganizationConfig, ...]
    ) -> tuple[OrganizationConfig, ...]:
        """Two organizations with one id would share a transcript folder."""
        errors: list[tuple[_Loc, str, object]] = []
        first_index: dict[str, int] = {}
        for index, organization in enumerate(organizations):
            first = first_index.setdefault(organization.id, index)
            if first != index:
                message = (
                    f"duplicate organization id {organization.id!r} (also organizations[{first}])"
                )
                errors.append(((index, "id"), message, organization.id))
        if errors:
            raise _located_errors("GatewayConfig", errors)
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
            raise _located_errors("StorageConfig", [(("database_url",), message, None)])
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
        errors: list[tuple[_Loc, str, object]] = []
        for index, user in enumerate(identity.users):
            if user.org is None:
                message = f"required when organizations are configured (one of: {', '.join(known)})"
                errors.append((("users", index, "org"), message, None))
            elif user.org not in known:
                message = f"unknown organization {user.org!r} (configured: {', '.join(known)})"
                errors.append((("users", index, "org"), message, user.org))
        if errors:
            raise _located_errors("IdentityConfig", errors)
        return identity

    @field_validator("channels")
    @classmethod
    def _web_tokens_name_configured_users(
        cls, channels: ChannelsConfig, info: ValidationInfo
    ) -> ChannelsConfig:
        """A token for a user nobody configured could never be routed."""
        identity: IdentityConfig | None = info.data.get("identity")
        if identity is None:  # identity itself is invalid and already reported
            return channels
        known = {user.id for user in identity.users}
        errors: list[tuple[_Loc, str, object]] = [
            (("web", "tokens", index, "user"), f"unknown user {token.user!r}", token.user)
            for index, token in enumerate(channels.web.tokens)
            if token.user not in known
        ]
        if errors:
            raise _located_errors("ChannelsConfig", errors)
        return channels

    @field_validator("channels")
    @classmethod
    def _dev_open_web_only_on_loopback(
        cls, channels: ChannelsConfig, info: ValidationInfo
    ) -> ChannelsConfig:
        """dev_open trusts whatever user a request names: never reachable from other machines."""
        server: ServerConfig | None = info.data.get("server")
        web = channels.web
        if server is not None and web.enabled and web.dev_open and not is_loopback(server.host):
            raise _located_errors(
                "ChannelsConfig",
                [
                    (
                        ("web", "dev_open"),
                        f"dev_open is only allowed when server.host is a loopback address "
                        f"(it is {server.host!r}); configure tokens instead",
                        True,
                    )
                ],
            )
        return channels


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address or `localhost`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
