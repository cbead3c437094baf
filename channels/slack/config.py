"""The Slack channel's config section (`channels.slack`): an enabled channel without the
secret that authenticates its traffic refuses to load, with the error at the missing key."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
)

from primitives.config_types import (
    NonEmptyStr,
    StrictModel,
    is_blank,
    rule_error,
)


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
