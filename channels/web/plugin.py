"""The web channel as the gateway plugs it in (see `channels.plugin`)."""

from __future__ import annotations

from typing import Any

from channels.base import ChannelType
from channels.plugin import ChannelAdapter, ChannelPlugin, ChannelServices
from channels.web.adapter import WebChannel, WebSettings
from channels.web.config import WebChannelConfig
from primitives.config_types import Loc, is_loopback


def settings_of(section: WebChannelConfig) -> WebSettings:
    """The adapter's settings from its config section."""
    return WebSettings(
        dev_open=section.dev_open,
        tokens={token.token.get_secret_value(): token.user for token in section.tokens},
        max_text_chars=section.max_text_chars,
        streaming=section.streaming,
    )


def open_web(settings: WebSettings, services: ChannelServices) -> ChannelAdapter:
    """The web channel's routes over the gateway's inbox, reply feed, history and exports."""
    return WebChannel(
        settings,
        services.inbox,
        services.feed,
        services.exports,
        clock=services.clock,
        on_rejected=services.on_rejected,
        history=services.history,
        files=services.files,
        file_limits=services.file_limits,
    )


def check(section: WebChannelConfig, config: Any) -> list[tuple[Loc, str, object]]:
    """Tokens must name configured users (else they could never be routed), and `dev_open`,
    which trusts whatever user a request names, is only for a server on loopback."""
    known = {user.id for user in config.identity.users}
    problems: list[tuple[Loc, str, object]] = [
        (("tokens", index, "user"), f"unknown user {token.user!r}", token.user)
        for index, token in enumerate(section.tokens)
        if token.user not in known
    ]
    host = config.server.host
    if section.enabled and section.dev_open and not is_loopback(host):
        message = (
            f"dev_open is only allowed when server.host is a loopback address "
            f"(it is {host!r}); configure tokens instead"
        )
        problems.append((("dev_open",), message, True))
    return problems


PLUGIN: ChannelPlugin[WebChannelConfig, WebSettings] = ChannelPlugin(
    channel_type=ChannelType.WEB,
    config_model=WebChannelConfig,
    settings_of=settings_of,
    open=open_web,
    reloadable=frozenset({"dev_open", "tokens", "max_text_chars", "streaming"}),
    restart_only=frozenset(),
    pulls_replies=True,
    check=check,
    title="web",
)
