"""Replies from the Teams channel to a fake Bot Connector: throttling and refusals as retryable
or permanent errors, the bot token fetched once; and the channel refusing to start without
credentials."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import pytest

from channels.base import ChannelMessage, ChannelType, OutboundMessage
from channels.teams.adapter import TeamsChannel, TeamsSettings
from errors import ConfigError, DeliveryError
from tests.channels.teams_activities import (
    personal_message,
)
from tests.channels.teams_channel_harness import (
    NOW,
    RecordingInbox,
    ServedChannel,
    reply_to,
    serve_channel,
)
from tests.fakes.bot_framework import (
    APP_ID,
    APP_PASSWORD,
    FakeBotFramework,
    free_port,
)

# --- outbound --------------------------------------------------------------------------------


async def _accepted(teams: ServedChannel) -> ChannelMessage:
    assert (await teams.post(personal_message(teams.fake))).status_code == 200
    return teams.inbox.accepted[-1]


async def test_a_throttled_reply_raises_a_retryable_error_with_retry_after(
    teams: ServedChannel,
) -> None:
    message = await _accepted(teams)
    teams.fake.fail_next(429, {"Retry-After": "7"})
    with pytest.raises(DeliveryError) as raised:
        await teams.channel.send(reply_to(message))
    assert raised.value.retry_after == 7
    assert not raised.value.permanent

    teams.fake.fail_next(503)
    with pytest.raises(DeliveryError) as raised:
        await teams.channel.send(reply_to(message))
    assert not raised.value.permanent

    receipt = await teams.channel.send(reply_to(message))  # the next attempt goes through
    assert receipt.platform_message_id == "reply-1"
    assert len(teams.fake.posted) == 1


async def test_a_refused_reply_is_a_permanent_error(teams: ServedChannel) -> None:
    message = await _accepted(teams)
    teams.fake.fail_next(404)
    with pytest.raises(DeliveryError) as raised:
        await teams.channel.send(reply_to(message))
    assert raised.value.permanent


async def test_an_unreachable_connector_is_a_retryable_error(teams: ServedChannel) -> None:
    message = await _accepted(teams)
    reply = reply_to(message)
    reference = dict(reply.reply_context["conversation_reference"])
    reference["serviceUrl"] = f"http://127.0.0.1:{free_port()}/amer/"
    unreachable = OutboundMessage(
        message_id="out-2",
        channel_type=ChannelType.TEAMS,
        channel_id=reply.channel_id,
        content="hello?",
        reply_context={**reply.reply_context, "conversation_reference": reference},
    )
    with pytest.raises(DeliveryError) as raised:
        await teams.channel.send(unreachable)
    assert not raised.value.permanent


async def test_the_bot_token_is_fetched_once_and_reused(teams: ServedChannel) -> None:
    message = await _accepted(teams)
    await teams.channel.send(reply_to(message))
    await teams.channel.send(reply_to(message))
    assert len(teams.fake.posted) == 2
    [token_request] = teams.fake.token_requests
    assert token_request["grant_type"] == "client_credentials"
    assert token_request["client_id"] == APP_ID
    assert token_request["scope"] == "https://api.botframework.com/.default"


async def test_wrong_app_credentials_make_replies_fail_permanently(
    fake: FakeBotFramework,
) -> None:
    async with serve_channel(fake, app_password="not-the-password") as teams:
        message = await _accepted(teams)
        with pytest.raises(DeliveryError) as raised:
            await teams.channel.send(reply_to(message))
    assert raised.value.permanent
    assert fake.posted == []


async def test_a_reply_without_a_conversation_reference_fails_permanently(
    teams: ServedChannel,
) -> None:
    outbound = OutboundMessage(
        message_id="out-3", channel_type=ChannelType.TEAMS, channel_id="x", content="hi"
    )
    with pytest.raises(DeliveryError) as raised:
        await teams.channel.send(outbound)
    assert raised.value.permanent


# --- start-up --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("app_id", "password", "key"), [("", APP_PASSWORD, "app_id"), (APP_ID, " ", "app_password")]
)
def test_the_channel_refuses_to_start_without_credentials(
    app_id: str, password: str, key: str
) -> None:
    with pytest.raises(ConfigError, match=f"channels.teams.{key}"):
        TeamsChannel(
            TeamsSettings(app_id=app_id, app_password=password), RecordingInbox(), clock=_now
        )


async def test_insecure_dev_mode_starts_without_credentials() -> None:
    channel = TeamsChannel(
        TeamsSettings(app_id="", app_password="", insecure_dev_mode=True),
        RecordingInbox(),
        clock=_now,
    )
    await channel.stop()


_now: Callable[[], datetime] = lambda: NOW  # noqa: E731
