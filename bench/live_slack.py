"""The Slack half of the live-replies benchmark: every user writes in a DM thread of their own
at once (a wave), the gateway streams the answers into the fake Slack Web API (Slack's
per-minute tiers enforced), and the answers are measured from the fake's record of calls.

Per answer (a user's thread in a wave): the status (the 200 of the Events API POST → the first
`assistant.threads.setStatus` of that thread), the first visible text (the model's first text
delta → the `chat.startStream` or `chat.postMessage` that created the thread's message), the
calls made while it streamed (from that call to the last `chat.stopStream`/`chat.update` that
finished it, per 100 ms), every call made for it, and whether the thread holds exactly one
finished message with the answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
from benchkit import progress
from live_figures import (
    TokenTimes,
    count_goal,
    latency_goal,
    marker,
    mean,
    message_text,
    percentiles_ms,
    token_times,
)

from tests.fakes.anthropic_api import ANSWER_END, FakeAnthropicAPI
from tests.fakes.slack_api import (
    TEAM,
    FakeSlackAPI,
    SlackCall,
    SlackMessage,
    direct_message,
    event_envelope,
    sign,
)

GOAL_FIRST_TEXT_MS = 500.0
GOAL_STATUS_MS = 300.0
GOAL_CALLS_PER_100MS = 1.0
CREATING = ("chat.startStream", "chat.postMessage")
FINISHING = ("chat.stopStream", "chat.update")


@dataclass(frozen=True, slots=True)
class SlackAnswer:
    """One message a user wrote in a DM thread, and when the gateway acknowledged it."""

    user: int
    wave: int
    mark: str
    accepted_at: float | None  # time.monotonic() of the 200; None when it failed
    error: str | None

    @property
    def channel(self) -> str:
        return f"D{self.user:05d}"

    @property
    def thread_ts(self) -> str:
        return f"17000{self.wave:05d}.{self.user:06d}"


def slack_identities(streams: int) -> list[dict[str, Any]]:
    """The benchmark's Slack users: s00000… as U00000… in workspace `TEAM`."""
    return [
        {"id": f"s{n:05d}", "org": "acme", "slack": [f"{TEAM}:U{n:05d}"]} for n in range(streams)
    ]


async def send_wave(client: httpx.AsyncClient, wave: int, streams: int) -> list[SlackAnswer]:
    """Every user writes in a new DM thread of their own, all at once."""

    async def one(user: int) -> SlackAnswer:
        mark = marker("s", user, wave)
        answer = SlackAnswer(user, wave, mark, None, None)
        event = direct_message(
            message_text(mark),
            user=f"U{user:05d}",
            ts=f"18000{wave:05d}.{user:06d}",
            channel=answer.channel,
            thread_ts=answer.thread_ts,
        )
        body = json.dumps(event_envelope(event, f"EvLive{wave:03d}{user:05d}")).encode()
        headers = {"Content-Type": "application/json", **sign(body)}
        try:
            response = await client.post("/slack/events", content=body, headers=headers)
        except httpx.HTTPError as exc:
            return SlackAnswer(user, wave, mark, None, repr(exc))
        if response.status_code != 200:
            return SlackAnswer(user, wave, mark, None, f"HTTP {response.status_code}")
        return SlackAnswer(user, wave, mark, time.monotonic(), None)

    return list(await asyncio.gather(*(one(user) for user in range(streams))))


def thread_messages(api: FakeSlackAPI, answer: SlackAnswer) -> list[SlackMessage]:
    """The app's messages in the answer's thread."""
    return [
        message
        for message in list(api.messages.values())
        if message.channel == answer.channel and message.thread_ts == answer.thread_ts
    ]


def is_finished(api: FakeSlackAPI, answer: SlackAnswer) -> bool:
    """The thread has a message that is no longer streaming and holds the whole answer."""
    return any(
        not message.streaming and answer.mark in message.text and ANSWER_END in message.text
        for message in thread_messages(api, answer)
    )


async def wait_for_answers(api: FakeSlackAPI, answers: list[SlackAnswer], wait_s: float) -> bool:
    """Until every acknowledged message has its finished answer (False at the timeout)."""
    deadline = time.monotonic() + wait_s
    pending = [answer for answer in answers if answer.accepted_at is not None]
    while pending:
        pending = [answer for answer in pending if not is_finished(api, answer)]
        if pending and time.monotonic() > deadline:
            progress(f"slack: {len(pending)} answers unfinished after {wait_s:.0f}s")
            return False
        await asyncio.sleep(0.1)
    return True


async def run_waves(
    base_url: str, api: FakeSlackAPI, *, streams: int, waves: int, wait_s: float
) -> list[SlackAnswer]:
    """The waves one after the other, each once the previous one's answers are finished."""
    answers: list[SlackAnswer] = []
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30) as client:
        for wave in range(1, waves + 1):
            progress(f"slack: wave {wave} of {waves}, {streams} DM threads at once")
            sent = await send_wave(client, wave, streams)
            answers += sent
            await wait_for_answers(api, sent, wait_s)
    return answers


def _belongs(call: SlackCall, answer: SlackAnswer, ts: str | None) -> bool:
    params = call.params
    channel = params.get("channel") or params.get("channel_id")
    if channel != answer.channel:
        return False
    return params.get("thread_ts") == answer.thread_ts or (
        ts is not None and params.get("ts") == ts
    )


@dataclass(frozen=True, slots=True)
class AnswerCalls:
    """The calls of one answer, as the fake recorded them."""

    all: list[SlackCall]
    status_at: float | None
    created: SlackCall | None
    finished: SlackCall | None

    def streaming_rate(self) -> float | None:
        """Calls per 100 ms between the first visible text and the finishing call."""
        if self.created is None or self.finished is None:
            return None
        start, end = self.created.at, self.finished.at
        if end <= start:
            return None
        during = [call for call in self.all if start <= call.at <= end]
        return float(len(during) / ((end - start) / 0.1))


def answer_calls(calls: list[SlackCall], answer: SlackAnswer) -> AnswerCalls:
    """Sort out the calls of one answer (`calls` in arrival order)."""
    created = next(
        (
            call
            for call in calls
            if call.method in CREATING and call.params.get("ok") and _belongs(call, answer, None)
        ),
        None,
    )
    ts = str(created.params.get("ts")) if created is not None else None
    mine = [call for call in calls if _belongs(call, answer, ts)]
    status_at = next(
        (
            call.at
            for call in mine
            if call.method == "assistant.threads.setStatus"
            and call.params.get("ok")
            and call.params.get("status")
        ),
        None,
    )
    finishing = [
        call
        for call in mine
        if call.method in FINISHING and call.params.get("ok") and call.params.get("ts") == ts
    ]
    return AnswerCalls(mine, status_at, created, _final(finishing))


def _final(finishing: list[SlackCall]) -> SlackCall | None:
    """The call that finished the answer: the first that wrote its end, else the stream's
    stop (the streamed text had the end already)."""
    for call in finishing:
        if ANSWER_END in str(call.params.get("text") or call.params.get("markdown_text") or ""):
            return call
    return next((call for call in finishing if call.method == "chat.stopStream"), None)


def answer_record(
    api: FakeSlackAPI, answer: SlackAnswer, found: AnswerCalls, tokens: TokenTimes | None
) -> dict[str, Any]:
    """One answer's timeline (`time.monotonic()` seconds) and counts, for the figures and for
    `--details`."""
    created_at = found.created.at if found.created is not None else None
    finished_at = found.finished.at if found.finished is not None else None
    updates = [
        call
        for call in found.all
        if call.method in ("chat.appendStream", "chat.update")
        and call.params.get("ok")
        and (finished_at is None or call.at < finished_at)
    ]
    return {
        "user": answer.user,
        "wave": answer.wave,
        "accepted_at": answer.accepted_at,
        "status_at": found.status_at,
        "first_token_at": tokens.first if tokens else None,
        "created_at": created_at,
        "last_token_at": tokens.last if tokens else None,
        "finished_at": finished_at,
        "created_with": found.created.method if found.created is not None else None,
        "text_updates": len(updates),
        "calls": len(found.all),
        "failed_calls": sum(not call.params.get("ok") for call in found.all),
        "messages": len(thread_messages(api, answer)),
        "finished": is_finished(api, answer),
    }


def slack_records(
    api: FakeSlackAPI, model: FakeAnthropicAPI, answers: list[SlackAnswer]
) -> tuple[list[dict[str, Any]], Counter[str], list[float]]:
    """Every answer's record, the calls by method, and the call rates while streaming."""
    calls = list(api.calls)
    tokens = token_times(model, [answer.mark for answer in answers])
    records, rates = [], []
    methods: Counter[str] = Counter()
    for answer in answers:
        found = answer_calls(calls, answer)
        records.append(answer_record(api, answer, found, tokens.get(answer.mark)))
        methods.update(call.method for call in found.all)
        rate = found.streaming_rate()
        if rate is not None:
            rates.append(rate)
    return records, methods, rates


def _gaps(records: list[dict[str, Any]], start: str, end: str) -> list[float]:
    return [
        record[end] - record[start]
        for record in records
        if record[start] is not None and record[end] is not None
    ]


def slack_figures(
    api: FakeSlackAPI, model: FakeAnthropicAPI, answers: list[SlackAnswer]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The Slack figures against their goals, and every answer's record."""
    records, methods, rates = slack_records(api, model, answers)
    mean_rate = mean(rates)
    per_answer = [record["calls"] for record in records]
    updates = [record["text_updates"] for record in records]
    return {
        "answers": len(answers),
        "acknowledged": sum(answer.accepted_at is not None for answer in answers),
        "completed": sum(record["finished"] for record in records),
        "lost": sum(
            not record["finished"] and record["accepted_at"] is not None for record in records
        ),
        "duplicates": sum(max(record["messages"] - 1, 0) for record in records),
        "first_visible_text_after_first_token_ms": latency_goal(
            _gaps(records, "first_token_at", "created_at"), GOAL_FIRST_TEXT_MS
        ),
        "status_after_ack_ms": latency_goal(
            _gaps(records, "accepted_at", "status_at"), GOAL_STATUS_MS
        ),
        "api_calls_per_100ms_streaming": {
            "mean": mean_rate,
            "max": round(max(rates), 3) if rates else None,
            "answers": len(rates),
            "goal": f"mean <= {GOAL_CALLS_PER_100MS:g}",
            "met": mean_rate is not None and mean_rate <= GOAL_CALLS_PER_100MS,
        },
        "rate_limited_429": {
            **count_goal(sum(api.rate_limited.values())),
            "by_method": dict(api.rate_limited),
        },
        "final_text_after_last_token_ms": percentiles_ms(
            _gaps(records, "last_token_at", "finished_at")
        ),
        "text_updates_between_first_text_and_final": {
            "mean": mean(updates),
            "answers_with_none": sum(count == 0 for count in updates),
        },
        "api_calls_per_answer": {
            "mean": mean(per_answer),
            "max": max(per_answer, default=0),
            "by_method": {
                method: round(count / max(len(answers), 1), 2)
                for method, count in methods.most_common()
            },
        },
        "created_with": dict(Counter(record["created_with"] for record in records)),
    }, records
