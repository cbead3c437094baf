"""The Teams channel as the gateway plugs it in (see `channels.plugin`); botbuilder is
imported only when the channel is opened."""

from __future__ import annotations

from typing import TYPE_CHECKING

from channels.base import ChannelType
from channels.plugin import (
    ChannelAdapter,
    ChannelPlugin,
    ChannelServices,
    CheckSkippedError,
    DoctorCheck,
)
from channels.teams.config import TeamsChannelConfig

if TYPE_CHECKING:
    from channels.teams.adapter import TeamsSettings


def settings_of(section: TeamsChannelConfig) -> TeamsSettings:
    """The adapter's settings from its config section."""
    from channels.teams.adapter import TeamsSettings  # noqa: PLC0415

    return TeamsSettings(
        app_id=section.app_id,
        app_password=section.app_password.get_secret_value(),
        tenant_ids=tuple(section.tenant_ids),
        openid_metadata_url=section.openid_metadata_url or None,
        oauth_token_url=section.oauth_token_url or None,
        insecure_dev_mode=section.insecure_dev_mode,
        streaming=section.streaming,
        file_hosts=tuple(section.file_hosts),
    )


def open_teams(settings: TeamsSettings, services: ChannelServices) -> ChannelAdapter:
    """The Teams channel (raises `ConfigError` without credentials, unless insecure)."""
    from channels.teams.adapter import TeamsChannel  # noqa: PLC0415

    return TeamsChannel(
        settings, services.inbox, clock=services.clock, on_rejected=services.on_rejected
    )


async def check_token(section: TeamsChannelConfig) -> str:
    """The token endpoint issues the bot a token for the Bot Connector."""
    if section.insecure_dev_mode and not section.app_id:
        raise CheckSkippedError("insecure_dev_mode without an app id")
    import httpx  # noqa: PLC0415

    from channels.teams.auth import DEFAULT_SCOPE, DEFAULT_TOKEN_URL  # noqa: PLC0415

    url = section.oauth_token_url or DEFAULT_TOKEN_URL
    async with httpx.AsyncClient(timeout=10.0) as client:
        answer = await client.post(
            url,
            data={
                "grant_type": "client_credentials",
                "client_id": section.app_id,
                "client_secret": section.app_password.get_secret_value(),
                "scope": DEFAULT_SCOPE,
            },
        )
    if answer.status_code != 200 or "access_token" not in answer.json():
        raise RuntimeError(f"{url} answered {answer.status_code}: {answer.text[:200]}")
    return f"token issued by {url}"


PLUGIN: ChannelPlugin[TeamsChannelConfig, TeamsSettings] = ChannelPlugin(
    channel_type=ChannelType.TEAMS,
    config_model=TeamsChannelConfig,
    settings_of=settings_of,
    open=open_teams,
    reloadable=frozenset({"tenant_ids", "streaming", "file_hosts"}),
    restart_only=frozenset(
        {"insecure_dev_mode", "app_id", "app_password", "openid_metadata_url", "oauth_token_url"}
    ),
    doctor=(DoctorCheck("teams token", check_token),),
    title="Teams",
)
