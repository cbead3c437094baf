"""Slack's agent surface: what the assistant shows before the user writes.

`assistant_thread_started` (the user opened a new assistant thread) gets a greeting in the
thread and the suggested prompts; `app_home_opened` on the messages tab (the agent view) gets
the suggested prompts for the conversation, without a thread, at most once per user every
`home_prompts_every`; `assistant_thread_context_changed` (the user moved to another channel
with the assistant open) is only logged: the gateway does not use the channel as context. None
of these is a user message: they never reach the inbox, and Slack gets its answer at once
while the calls run on a task of their own (each event once, also when Slack retries it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.format import markdown_to_mrkdwn
from channels.slack.refusals import slack_call
from errors import DeliveryError
from primitives.bounded_cache import BoundedCache

log = structlog.stdlib.get_logger(__name__)

ASSISTANT_EVENTS = frozenset(
    {"assistant_thread_started", "assistant_thread_context_changed", "app_home_opened"}
)
REMEMBERED = 10_000  # event ids and users remembered


@dataclass(frozen=True, slots=True)
class SuggestedPrompt:
    """A prompt offered under the message box: its label and the message it sends."""

    title: str
    message: str


@dataclass(frozen=True, slots=True)
class AssistantSettings:
    """The greeting and prompts of the agent surface (`channels.slack.assistant`)."""

    greeting: str = "Hi! How can I help?"
    prompts_title: str = "Try asking"
    prompts: tuple[SuggestedPrompt, ...] = ()
    home_prompts_every: float = 3600.0  # seconds


class SlackAssistant:
    """Answers the agent surface's events (see the module docstring)."""

    def __init__(self, client: AsyncWebClient, settings: AssistantSettings) -> None:
        self.client = client
        self.settings = settings
        self._seen: BoundedCache[str, bool] = BoundedCache(REMEMBERED)
        self._home_prompted: BoundedCache[tuple[str, str], bool] = BoundedCache(
            REMEMBERED, ttl=settings.home_prompts_every
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def reconfigure(self, settings: AssistantSettings) -> None:
        """Greet and prompt with the reloaded settings from the next event on."""
        if settings.home_prompts_every != self.settings.home_prompts_every:
            self._home_prompted = BoundedCache(REMEMBERED, ttl=settings.home_prompts_every)
        self.settings = settings

    def handle(self, body: Mapping[str, Any]) -> None:
        """Start answering an agent-surface event; returns at once."""
        event = body.get("event")
        event_id = str(body.get("event_id") or "")
        if not isinstance(event, Mapping) or (event_id and self._seen.get(event_id)):
            return  # not an event, or Slack retried one already being answered
        if event_id:
            self._seen.put(event_id, True)
        kind = event.get("type")
        if kind == "assistant_thread_started":
            self._spawn(self._thread_started(event))
        elif kind == "app_home_opened":
            self._home_opened(str(body.get("team_id") or ""), event)
        elif kind == "assistant_thread_context_changed":
            thread = _mapping(event.get("assistant_thread"))
            log.info(
                "slack.assistant_context_changed",
                channel=thread.get("channel_id"),
                thread_ts=thread.get("thread_ts"),
                context_channel=_mapping(thread.get("context")).get("channel_id"),
            )

    async def finish(self) -> None:
        """Wait for the greetings and prompts still being sent."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _thread_started(self, event: Mapping[str, Any]) -> None:
        thread = _mapping(event.get("assistant_thread"))
        channel, thread_ts = str(thread.get("channel_id") or ""), str(thread.get("thread_ts") or "")
        if not channel or not thread_ts:
            log.warning("slack.assistant_thread_malformed", keys=sorted(thread))
            return
        await slack_call(
            self.client.chat_postMessage(
                channel=channel,
                thread_ts=thread_ts,
                text=markdown_to_mrkdwn(self.settings.greeting),
                mrkdwn=True,
            )
        )
        await self._prompt(channel, thread_ts)
        log.info("slack.assistant_thread_greeted", channel=channel, thread_ts=thread_ts)

    def _home_opened(self, team: str, event: Mapping[str, Any]) -> None:
        if event.get("tab") != "messages":
            return
        user, channel = str(event.get("user") or ""), str(event.get("channel") or "")
        if not channel or self._home_prompted.get((team, user)):
            return
        self._home_prompted.put((team, user), True)
        self._spawn(self._prompt(channel, None))

    async def _prompt(self, channel: str, thread_ts: str | None) -> None:
        prompts = [
            {"title": prompt.title, "message": prompt.message} for prompt in self.settings.prompts
        ]
        if not prompts:
            return
        await slack_call(
            self.client.assistant_threads_setSuggestedPrompts(
                channel_id=channel,
                thread_ts=thread_ts,
                title=self.settings.prompts_title or None,
                prompts=prompts,
            )
        )

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(self._logged(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _logged(work: Any) -> None:
        """A greeting or prompt is a courtesy: a refusal is logged, never raised."""
        try:
            await work
        except DeliveryError as exc:
            log.warning("slack.assistant_call_failed", error=str(exc))


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
