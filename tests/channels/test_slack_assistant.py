"""Slack's agent surface through the real endpoint: a new assistant thread gets a greeting and
suggested prompts, the messages tab gets prompts without a thread (once per user for a
while), and none of these events reaches the inbox; a user's message in an assistant thread
still does, in its thread."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import httpx
import pytest
import yaml
from starlette.applications import Starlette

from channels.live import ReplyTarget
from channels.slack.adapter import SlackChannel, SlackSettings
from channels.slack.assistant import AssistantSettings, SuggestedPrompt
from channels.slack.config import SlackChannelConfig
from channels.slack.plugin import settings_of
from tests.channels.slack_doubles import NoThreads, RecordingInbox
from tests.channels.test_slack import MANIFEST
from tests.fakes.slack_api import (
    SIGNING_SECRET,
    TEAM,
    FakeSlackAPI,
    app_home_opened,
    assistant_thread_started,
    direct_message,
    event_envelope,
    send_event,
)

PROMPTS = (
    SuggestedPrompt("Summarise", "Summarise this thread"),
    SuggestedPrompt("Draft", "Draft a reply"),
)


@pytest.fixture
async def served(slack_api: FakeSlackAPI) -> AsyncIterator[tuple[SlackChannel, RecordingInbox]]:
    settings = SlackSettings(
        bot_token="xoxb-test",
        signing_secret=SIGNING_SECRET,
        api_base_url=slack_api.url,
        assistant=AssistantSettings(greeting="Hello **there**", prompts=PROMPTS),
    )
    inbox = RecordingInbox()
    channel = SlackChannel(settings, inbox, NoThreads())
    await channel.start()
    yield channel, inbox
    await channel.stop()


async def deliver(channel: SlackChannel, *envelopes: dict[str, object]) -> list[int]:
    app = Starlette(routes=channel.routes())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://slack.test") as client:
        statuses = [(await send_event(client, envelope)).status_code for envelope in envelopes]
    await channel.assistant.finish()  # the greeting and prompts run on their own tasks
    return statuses


async def test_a_new_assistant_thread_gets_a_greeting_and_prompts_and_nothing_reaches_the_inbox(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI
) -> None:
    channel, inbox = served
    started = event_envelope(assistant_thread_started(thread_ts="1700000500.000100"), "EvA1")
    statuses = await deliver(channel, started, started)  # Slack retried it

    assert statuses == [200, 200]
    assert inbox.messages == []
    (greeting,) = slack_api.calls_to("chat.postMessage")
    assert greeting.params["channel"] == "D0001"
    assert greeting.params["thread_ts"] == "1700000500.000100"
    assert greeting.params["text"] == "Hello *there*"
    (prompts,) = slack_api.calls_to("assistant.threads.setSuggestedPrompts")
    assert prompts.params["thread_ts"] == "1700000500.000100"
    assert prompts.params["prompts"] == [
        {"title": "Summarise", "message": "Summarise this thread"},
        {"title": "Draft", "message": "Draft a reply"},
    ]


async def test_the_messages_tab_gets_prompts_without_a_thread_once_per_user(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI
) -> None:
    channel, inbox = served
    await deliver(
        channel,
        event_envelope(app_home_opened(), "EvH1"),
        event_envelope(app_home_opened(), "EvH2"),  # opened again soon after
        event_envelope(app_home_opened(tab="home"), "EvH3"),
        event_envelope(app_home_opened(user="U0002"), "EvH4"),
    )

    calls = slack_api.calls_to("assistant.threads.setSuggestedPrompts")
    assert len(calls) == 2  # U0001 once, U0002 once; the home tab gets none
    assert all("thread_ts" not in call.params for call in calls)
    assert all(call.params["channel_id"] == "D0001" for call in calls)
    assert inbox.messages == []


async def test_a_context_change_is_acknowledged_and_only_logged(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI
) -> None:
    channel, inbox = served
    event = assistant_thread_started(thread_ts="1700000500.000100")
    event["type"] = "assistant_thread_context_changed"
    assert await deliver(channel, event_envelope(event, "EvC1")) == [200]
    assert inbox.messages == []
    assert slack_api.calls_to("chat.postMessage", "assistant.threads.setSuggestedPrompts") == []


async def test_a_message_in_an_assistant_thread_is_a_user_message_in_that_thread(
    served: tuple[SlackChannel, RecordingInbox],
) -> None:
    channel, inbox = served
    message = direct_message("hello", ts="1700000600.000100", thread_ts="1700000500.000100")
    await deliver(channel, event_envelope(message, "EvM1"))
    (accepted,) = inbox.messages
    assert accepted.thread_id == "1700000500.000100"
    assert accepted.content == "hello"


async def test_an_assistant_thread_is_titled_and_other_conversations_are_not(
    served: tuple[SlackChannel, RecordingInbox], slack_api: FakeSlackAPI
) -> None:
    channel, _inbox = served
    context = {"channel": "D0001", "thread_ts": "1700000500.000100", "team_id": TEAM}
    where = ReplyTarget("D0001", "1700000500.000100", context, "alice", f"{TEAM}:U0001", "Ev1")
    await channel.set_title(where, "Quarterly report")
    await channel.set_title(dataclasses.replace(where, thread_id="", reply_context={}), "No")
    (title,) = slack_api.calls_to("assistant.threads.setTitle")
    assert (title.params["thread_ts"], title.params["title"]) == (
        "1700000500.000100",
        "Quarterly report",
    )


def test_the_config_section_defaults_and_limits_the_prompts() -> None:
    settings = settings_of(SlackChannelConfig())
    assert settings.streaming is True
    assert settings.assistant.greeting
    assert 1 <= len(settings.assistant.prompts) <= 4
    assert settings.assistant.home_prompts_every == 3600.0
    too_many = [{"title": f"t{n}", "message": f"m{n}"} for n in range(5)]
    with pytest.raises(ValueError, match="suggested_prompts"):
        SlackChannelConfig.model_validate({"assistant": {"suggested_prompts": too_many}})


def test_the_manifest_declares_the_agent_surface() -> None:
    manifest = yaml.safe_load(MANIFEST.read_text())
    features = manifest["features"]
    assert features["agent_view"]["agent_description"]
    assert 1 <= len(features["agent_view"]["suggested_prompts"]) <= 4
    assert features["assistant_view"]["assistant_description"]
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    assert {"assistant:write", "chat:write", "im:history"} <= scopes
    events = set(manifest["settings"]["event_subscriptions"]["bot_events"])
    assert {
        "assistant_thread_started",
        "assistant_thread_context_changed",
        "message.im",
        "app_home_opened",
    } <= events
