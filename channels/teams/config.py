"""The Teams channel's config section (`channels.teams`): the credentials are required unless
`insecure_dev_mode` says otherwise."""

from __future__ import annotations

from pydantic import (
    SecretStr,
    ValidationInfo,
    field_validator,
)

from primitives.config_types import (
    NonEmptyStr,
    OptionalStr,
    StrictModel,
    is_blank,
    rule_error,
)


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
    # Live replies: streamed in personal chats, a typing indicator elsewhere.
    streaming: bool = True

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
