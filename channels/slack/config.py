"""The Slack channel's config section (`channels.slack`): an enabled channel without the
secret that authenticates its traffic refuses to load, with the error at the missing key."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
)

from primitives.config_types import (
    Duration,
    NonEmptyStr,
    StrictModel,
    is_blank,
    rule_error,
)


class SlackSuggestedPrompt(StrictModel):
    """A prompt Slack offers under the message box of the assistant: its label and the
    message it sends."""

    title: NonEmptyStr
    message: NonEmptyStr


DEFAULT_PROMPTS = (
    SlackSuggestedPrompt(
        title="Summarise a thread", message="Please summarise the discussion I will paste next."
    ),
    SlackSuggestedPrompt(title="Draft a reply", message="Help me draft a reply to a message."),
    SlackSuggestedPrompt(
        title="Continue where we left off", message="What were we talking about last time?"
    ),
)


class SlackAssistantConfig(StrictModel):
    """The agent surface: what a new assistant thread shows before the user writes."""

    greeting: NonEmptyStr = "Hi! How can I help?"
    prompts_title: str = "Try asking"
    suggested_prompts: tuple[SlackSuggestedPrompt, ...] = Field(
        default=DEFAULT_PROMPTS, max_length=4
    )
    home_prompts_every: Duration = timedelta(hours=1)


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
    streaming: bool = True
    assistant: SlackAssistantConfig = SlackAssistantConfig()

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
