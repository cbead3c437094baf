"""The ``tools:`` section of the configuration schema: the MCP servers the assistant may use
and the policy that says who may use which of their tools.

`gateway.settings.GatewayConfig` holds it; `gateway.runtime_settings` turns it into the
session layer's `sessions.tool_policy.ToolPolicy` and `sessions.mcp_servers.McpServerSettings`.
A tool reaches the model as ``<server>__<tool>``, so a server's name may not contain ``__``.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, SecretStr, field_validator, model_validator

from primitives.config_types import (
    Duration,
    Loc,
    NonEmptyStr,
    StrictModel,
    located_errors,
    rule_error,
)

_SERVER_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_)){0,31}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_server_name(value: str) -> str:
    if not _SERVER_NAME_RE.fullmatch(value) or value.endswith("_"):
        raise rule_error(
            f"invalid server name {value!r}: use 1-32 letters, digits, '-' or single '_' "
            "(its tools are named <server>__<tool>)"
        )
    return value


def _confirm_globs(value: object) -> object:
    """``confirm: true`` asks before every tool of the server; a list names the tools."""
    if value is True:
        return ("*",)
    if value is False or value is None:
        return ()
    return value


class McpServerConfig(StrictModel):
    """One MCP server: a process the gateway starts (stdio) or an endpoint it connects to
    (streamable HTTP), with what of it the model may see."""

    name: NonEmptyStr
    # A server that is not enabled is neither started nor offered (its config still checked).
    enabled: bool = True
    transport: Literal["stdio", "http"]
    # stdio: the command, its arguments and its whole environment (nothing else is passed on).
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, SecretStr] = Field(default_factory=dict)
    # http: the endpoint and the headers sent with every request (e.g. Authorization).
    url: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    # How long one call may take before the model is told it timed out.
    timeout: Duration = timedelta(seconds=30)
    # Results longer than this many characters are cut (the model is told).
    max_result_chars: int = Field(default=20_000, ge=100)
    # Globs over the server's own tool names: only these reach the model.
    expose: tuple[NonEmptyStr, ...] = ("*",)
    # Globs over the server's own tool names (or true: all) that run only after the user's yes.
    confirm: Annotated[tuple[NonEmptyStr, ...], BeforeValidator(_confirm_globs)] = ()

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return _check_server_name(value)

    @field_validator("timeout")
    @classmethod
    def _positive_timeout(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise rule_error("must be longer than 0s")
        return value

    @model_validator(mode="after")
    def _transport_keys(self) -> McpServerConfig:
        """Each transport has its own keys; the other's are mistakes, not silently ignored."""
        errors: list[tuple[Loc, str, object]] = []
        if self.transport == "stdio":
            if not self.command or not self.command.strip():
                errors.append((("command",), "required for transport stdio", self.command))
            errors.extend(
                ((key,), "only for transport http", None)
                for key in ("url", "headers")
                if getattr(self, key)
            )
            errors.extend(
                (("env", name), f"invalid environment variable name {name!r}", name)
                for name in self.env
                if not _ENV_NAME_RE.fullmatch(name)
            )
        else:
            if not self.url or not self.url.startswith(("http://", "https://")):
                errors.append((("url",), "required for transport http: an http(s) URL", self.url))
            errors.extend(
                ((key,), "only for transport stdio", None)
                for key in ("command", "args", "env")
                if getattr(self, key)
            )
        if errors:
            raise located_errors("McpServerConfig", errors)
        return self


class ToolPolicyRuleConfig(StrictModel):
    """Who (organizations or users, by glob) may or may not use which tools (by glob over
    ``server__tool``). Nothing is offered unless a rule allows it; a matching deny wins."""

    orgs: tuple[NonEmptyStr, ...] = ()
    users: tuple[NonEmptyStr, ...] = ()
    allow: tuple[NonEmptyStr, ...] = ()
    deny: tuple[NonEmptyStr, ...] = ()

    @model_validator(mode="after")
    def _names_someone_and_something(self) -> ToolPolicyRuleConfig:
        errors: list[tuple[Loc, str, object]] = []
        if not self.orgs and not self.users:
            errors.append((("orgs",), 'a rule names orgs or users (a glob: ["*"] is all)', None))
        if not self.allow and not self.deny:
            errors.append((("allow",), "a rule allows or denies some tools", None))
        if errors:
            raise located_errors("ToolPolicyRuleConfig", errors)
        return self


class ToolsConfig(StrictModel):
    """Tools the assistant may use through MCP servers, and who may use them."""

    # Model ↔ tool round trips in one turn; past them the turn fails.
    max_rounds: int = Field(default=8, ge=1, le=50)
    # How long a question "Run X? Reply yes or no" waits for the user's yes.
    confirm_within: Duration = timedelta(minutes=10)
    mcp_servers: tuple[McpServerConfig, ...] = ()
    policy: tuple[ToolPolicyRuleConfig, ...] = ()

    @field_validator("mcp_servers")
    @classmethod
    def _server_names_unique(
        cls, servers: tuple[McpServerConfig, ...]
    ) -> tuple[McpServerConfig, ...]:
        errors: list[tuple[Loc, str, object]] = []
        first: dict[str, int] = {}
        for index, server in enumerate(servers):
            seen = first.setdefault(server.name, index)
            if seen != index:
                message = f"duplicate server name {server.name!r} (also mcp_servers[{seen}])"
                errors.append(((index, "name"), message, server.name))
        if errors:
            raise located_errors("ToolsConfig", errors)
        return servers
