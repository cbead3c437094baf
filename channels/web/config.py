"""The web channel's config section (`channels.web`)."""

from __future__ import annotations

from pydantic import (
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
)

from primitives.config_types import (
    Identifier,
    Loc,
    StrictModel,
    is_blank,
    located_errors,
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
    streaming: bool = True

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
