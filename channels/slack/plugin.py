"""The Slack channel as the gateway plugs it in (see `channels.plugin`); slack-bolt is
imported only when the channel is opened."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from channels.base import ChannelType
from channels.plugin import ChannelAdapter, ChannelPlugin, ChannelServices, DoctorCheck
from channels.slack.config import SlackChannelConfig

if TYPE_CHECKING:
    from channels.slack.adapter import SlackSettings


def settings_of(section: SlackChannelConfig) -> SlackSettings:
    """The adapter's settings from its config section."""
    from channels.slack.adapter import SlackSettings  # noqa: PLC0415
    from channels.slack.assistant import AssistantSettings, SuggestedPrompt  # noqa: PLC0415

    assistant = section.assistant
    return SlackSettings(
        bot_token=section.bot_token.get_secret_value(),
        signing_secret=section.signing_secret.get_secret_value(),
        mode=section.mode,
        app_token=section.app_token.get_secret_value(),
        allowed_team_ids=frozenset(section.allowed_team_ids),
        api_base_url=section.api_base_url,
        max_text_chars=section.max_text_chars,
        streaming=section.streaming,
        assistant=AssistantSettings(
            greeting=assistant.greeting,
            prompts_title=assistant.prompts_title,
            prompts=tuple(
                SuggestedPrompt(prompt.title, prompt.message)
                for prompt in assistant.suggested_prompts
            ),
            home_prompts_every=assistant.home_prompts_every.total_seconds(),
        ),
    )


def open_slack(settings: SlackSettings, services: ChannelServices) -> ChannelAdapter:
    """The Slack channel; `start` checks the bot token (and connects in socket mode)."""
    from channels.slack.adapter import SlackChannel  # noqa: PLC0415

    return SlackChannel(
        settings, services.inbox, services.threads, on_rejected=services.on_rejected
    )


def email_lookup(adapter: ChannelAdapter) -> Callable[[str], Awaitable[str | None]]:
    """A Slack user's email address, from their profile (`users.info`)."""
    from channels.slack.adapter import SlackChannel  # noqa: PLC0415

    if not isinstance(adapter, SlackChannel):
        raise TypeError(f"not a Slack adapter: {adapter!r}")
    return adapter.email_of


async def check_token(section: SlackChannelConfig) -> str:
    """Slack accepts the bot token (`auth.test`)."""
    from slack_sdk.web.async_client import AsyncWebClient  # noqa: PLC0415

    client = AsyncWebClient(
        token=section.bot_token.get_secret_value(), base_url=section.api_base_url
    )
    answer = await client.auth_test()
    return f"team {answer.get('team_id')} as {answer.get('user')} ({answer.get('user_id')})"


PLUGIN: ChannelPlugin[SlackChannelConfig, SlackSettings] = ChannelPlugin(
    channel_type=ChannelType.SLACK,
    config_model=SlackChannelConfig,
    settings_of=settings_of,
    open=open_slack,
    reloadable=frozenset({"allowed_team_ids", "max_text_chars", "streaming", "assistant"}),
    restart_only=frozenset({"mode", "bot_token", "signing_secret", "app_token", "api_base_url"}),
    delivers_files=True,
    email_lookup=email_lookup,
    doctor=(DoctorCheck("slack auth.test", check_token),),
    title="Slack",
)
