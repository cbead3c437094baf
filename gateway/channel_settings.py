"""The configuration of each channel (`channels.web|slack|teams|email`).

Each section fails closed: an enabled channel without the secret that authenticates its
traffic refuses to load, with the error at the missing key. `gateway.settings` assembles them
into `ChannelsConfig` rules that read other sections (web tokens name configured users).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
)

from gateway.config_types import (
    EmailAddress,
    Identifier,
    Loc,
    NonEmptyStr,
    OptionalStr,
    Port,
    StrictModel,
    empty_to_none,
    is_blank,
    located_errors,
    off_from_false,
    rule_error,
)


class WebToken(StrictModel):
    """A bearer token of the web channel and the user it authenticates."""

    token: SecretStr
    user: Identifier

    @field_validator("token")
    @classmethod
    def _token_not_empty(cls, value: SecretStr) -> SecretStr:
        """An empty token (an unset ``${VAR:-}``) would let anyone in as that user."""
        if is_blank(value):
            raise rule_error("must not be empty")
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
            raise rule_error(
                "at least one token is required when the web channel is enabled without dev_open",
            )
        seen: dict[str, int] = {}
        errors: list[tuple[Loc, str, object]] = []
        for index, item in enumerate(tokens):
            first = seen.setdefault(item.token.get_secret_value(), index)
            if first != index:
                errors.append(((index, "token"), f"same token as tokens[{first}]", item.token))
        if errors:
            raise located_errors("WebChannelConfig", errors)
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
        if info.data.get("enabled") and is_blank(value):
            raise rule_error("required when the Slack channel is enabled")
        return value

    @field_validator("signing_secret")
    @classmethod
    def _http_needs_signing_secret(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        """Without it, inbound events could not be verified: refuse instead of trusting them."""
        if info.data.get("enabled") and info.data.get("mode") == "http" and is_blank(value):
            raise rule_error("required when the Slack channel is enabled with mode http")
        return value

    @field_validator("app_token")
    @classmethod
    def _socket_needs_app_token(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        """Socket Mode connects with the app-level token."""
        if info.data.get("enabled") and info.data.get("mode") == "socket" and is_blank(value):
            raise rule_error("required when the Slack channel is enabled with mode socket")
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
        if info.data.get("enabled") and not info.data.get("insecure_dev_mode") and is_blank(value):
            raise rule_error(
                "required when the Teams channel is enabled (unless insecure_dev_mode: true)",
            )
        return value

    @field_validator("app_password")
    @classmethod
    def _enabled_needs_app_password(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        """Replies are sent with a token obtained with the app password."""
        if info.data.get("enabled") and not info.data.get("insecure_dev_mode") and is_blank(value):
            raise rule_error(
                "required when the Teams channel is enabled (unless insecure_dev_mode: true)",
            )
        return value


class EmailAuthConfig(StrictModel):
    """How inbound mail proves its sender: own DKIM/DMARC checks, a trusted MTA's
    Authentication-Results header, or not at all (``"off"``, development only)."""

    mode: Annotated[Literal["verify", "trusted_mta", "off"], BeforeValidator(off_from_false)] = (
        "verify"
    )
    trusted_authserv_id: OptionalStr = None

    @field_validator("trusted_authserv_id")
    @classmethod
    def _trusted_mta_needs_authserv_id(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Without it, a sender could forge the Authentication-Results header themselves."""
        if info.data.get("mode") == "trusted_mta" and value is None:
            raise rule_error("required when channels.email.auth.mode is trusted_mta")
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
    tls_cert: Annotated[Path | None, BeforeValidator(empty_to_none)] = None
    tls_key: Annotated[Path | None, BeforeValidator(empty_to_none)] = Field(
        default=None, validate_default=True
    )
    # Mails routed per sender and hour; more are deferred with 451 (0: no limit).
    replies_per_sender_per_hour: int = Field(default=30, ge=0)

    @field_validator("tls_key")
    @classmethod
    def _tls_needs_cert_and_key(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        """A certificate without its key (or the reverse) cannot start TLS."""
        if (value is None) != (info.data.get("tls_cert") is None):
            raise rule_error("tls_cert and tls_key must be set together")
        return value

    @field_validator("addresses")
    @classmethod
    def _enabled_needs_address(
        cls, addresses: tuple[str, ...], info: ValidationInfo
    ) -> tuple[str, ...]:
        """An SMTP server that accepts no recipient would reject everything."""
        if info.data.get("enabled") and not addresses:
            raise rule_error("at least one address is required when the email channel is enabled")
        return addresses
