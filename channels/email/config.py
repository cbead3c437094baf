"""The email channel's config section (`channels.email`): the SMTP listener, how inbound mail
proves its sender, and outbound delivery."""

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

from primitives.config_types import (
    EmailAddress,
    OptionalStr,
    Port,
    StrictModel,
    empty_to_none,
    off_from_false,
    rule_error,
)


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
    """Where replies go: through an SMTP server (``mode: smtp``, the keys below it), or into a
    folder as one ``.eml`` file each (``mode: files``, for development: nothing is sent)."""

    mode: Literal["smtp", "files"] = "smtp"
    host: str = "localhost"
    port: Port = 25
    starttls: bool = False
    username: str = ""
    password: SecretStr = SecretStr("")
    directory: Path = Path("./var/outbox")

    @field_validator("directory", mode="before")
    @classmethod
    def _directory_is_a_path(cls, value: object) -> object:
        """An empty value would silently mean the working directory."""
        if isinstance(value, str) and not value.strip():
            raise rule_error("must not be empty: the folder that receives replies in files mode")
        return value


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
