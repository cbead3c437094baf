"""The Teams half of the live-replies benchmark: every user writes in their personal chat with
the bot at once (a wave), with activities signed by the fake Bot Framework's JWTs, and the
gateway streams the answers there (streaminfo typing activities, then the final message).

Figures from the fake connector's record: the smallest gap between two requests to one chat
and how many came less than a second apart (Teams allows one a second), the latest streaming
update of each stream counted from the request that opened it (Teams ends a stream after two
minutes), and whether each message got exactly one answer (its stream's final, or a plain
message instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from benchkit import BenchError, progress
from live_figures import count_goal, marker, message_text, percentiles_ms, token_times

from tests.channels.teams_activities import TENANT
from tests.fakes.anthropic_api import ANSWER_END, FakeAnthropicAPI
from tests.fakes.bot_framework import APP_ID, APP_PASSWORD, FakeBotFramework, PostedActivity

GOAL_MIN_GAP_S = 1.0
GOAL_STREAM_S = 120.0


@dataclass(frozen=True, slots=True)
class TeamsAnswer:
    """One message a user wrote in their personal chat, and whether the gateway took it."""

    user: int
    wave: int
    mark: str
    accepted: bool
    error: str | None

    @property
    def conversation(self) -> str:
        return f"a:1bench-personal-{self.user:05d}"

    @property
    def activity_id(self) -> str:
        return f"17{self.wave:03d}{self.user:08d}"


def aad_id(user: int) -> str:
    """The user's Entra object id."""
    return f"6b4d2c1e-0000-4000-8000-{user:012d}"


def teams_identities(streams: int) -> list[dict[str, Any]]:
    """The benchmark's Teams users: t00000… by their Entra object ids."""
    return [{"id": f"t{n:05d}", "org": "acme", "teams": [aad_id(n)]} for n in range(streams)]


def teams_config(fake: FakeBotFramework) -> dict[str, Any]:
    """`channels.teams` for a gateway that talks to the fake."""
    return {
        "enabled": True,
        "app_id": APP_ID,
        "app_password": APP_PASSWORD,
        "tenant_ids": [TENANT],
        "openid_metadata_url": fake.openid_metadata_url,
        "oauth_token_url": fake.token_url,
    }


@contextlib.contextmanager
def bot_framework_thread() -> Iterator[FakeBotFramework]:
    """The fake Bot Framework on an event loop of its own, in a thread (it serves while the
    benchmark's own loop waits on the gateway)."""
    ready: list[FakeBotFramework] = []
    started = threading.Event()
    failed: list[BaseException] = []
    holder: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        holder["stop"] = stop
        holder["loop"] = asyncio.get_running_loop()
        try:
            async with FakeBotFramework() as fake:
                ready.append(fake)
                started.set()
                await stop.wait()
        except Exception as exc:  # noqa: BLE001 - reported to the benchmark below
            failed.append(exc)
            started.set()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    if not started.wait(timeout=30) or not ready:
        raise BenchError(f"the fake Bot Framework did not start: {failed}")
    try:
        yield ready[0]
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(timeout=10)


def personal_activity(fake: FakeBotFramework, answer: TeamsAnswer) -> dict[str, Any]:
    """The user's message in their personal chat, as Teams sends it."""
    return {
        "type": "message",
        "id": answer.activity_id,
        "timestamp": "2025-06-01T12:00:00.1234567Z",
        "serviceUrl": fake.service_url,
        "channelId": "msteams",
        "from": {"id": f"29:1bench{answer.user:05d}", "aadObjectId": aad_id(answer.user)},
        "conversation": {
            "id": answer.conversation,
            "conversationType": "personal",
            "tenantId": TENANT,
        },
        "recipient": {"id": f"28:{APP_ID}", "name": "Assistant"},
        "textFormat": "plain",
        "text": message_text(answer.mark),
        "locale": "en-US",
        "channelData": {"tenant": {"id": TENANT}},
    }


async def send_one(
    client: httpx.AsyncClient, fake: FakeBotFramework, user: int, wave: int
) -> TeamsAnswer:
    """The user writes in their personal chat."""
    answer = TeamsAnswer(user, wave, marker("t", user, wave), False, None)
    try:
        response = await client.post(
            "/api/messages", json=personal_activity(fake, answer), headers=fake.bearer()
        )
    except httpx.HTTPError as exc:
        return TeamsAnswer(user, wave, answer.mark, False, repr(exc))
    error = None if response.status_code in (200, 201, 202) else f"HTTP {response.status_code}"
    return TeamsAnswer(user, wave, answer.mark, error is None, error)


async def send_wave(
    client: httpx.AsyncClient, fake: FakeBotFramework, wave: int, streams: int
) -> list[TeamsAnswer]:
    """Every user writes in their personal chat, all at once."""
    return list(
        await asyncio.gather(*(send_one(client, fake, user, wave) for user in range(streams)))
    )


def replies_to(fake: FakeBotFramework, answer: TeamsAnswer) -> list[PostedActivity]:
    """The messages (finals or plain) posted in the answer's chat that carry its marker."""
    return [
        post
        for post in list(fake.posted)
        if post.conversation_id == answer.conversation
        and answer.mark in str(post.body.get("text") or "")
    ]


async def wait_for_answers(
    fake: FakeBotFramework, answers: list[TeamsAnswer], wait_s: float
) -> None:
    """Until every accepted message has an answer (or the timeout passed)."""
    deadline = time.monotonic() + wait_s
    pending = [answer for answer in answers if answer.accepted]
    while pending:
        pending = [answer for answer in pending if not replies_to(fake, answer)]
        if pending and time.monotonic() > deadline:
            progress(f"teams: {len(pending)} answers missing after {wait_s:.0f}s")
            return
        await asyncio.sleep(0.2)


async def run_waves(
    base_url: str, fake: FakeBotFramework, *, streams: int, waves: int, wait_s: float
) -> list[TeamsAnswer]:
    """The waves one after the other, each once the previous one's answers arrived."""
    answers: list[TeamsAnswer] = []
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30) as client:
        for wave in range(1, waves + 1):
            progress(f"teams: wave {wave} of {waves}, {streams} personal chats at once")
            sent = await send_wave(client, fake, wave, streams)
            answers += sent
            await wait_for_answers(fake, sent, wait_s)
    return answers


def stream_ages(fake: FakeBotFramework) -> tuple[list[float], list[float]]:
    """For each stream: seconds from its opening request to its last streaming update, and
    to its final message."""
    last_update: dict[str, float] = {}
    final: dict[str, float] = {}
    for post in list(fake.typing) + list(fake.posted):
        info = post.stream_info or {}
        stream = fake.streams.get(str(info.get("streamId") or ""))
        if stream is None:
            continue
        age = post.received_at - stream.started_at
        if info.get("streamType") == "final":
            final[stream.stream_id] = age
        else:
            last_update[stream.stream_id] = max(age, last_update.get(stream.stream_id, 0.0))
    return list(last_update.values()), list(final.values())


def final_lags(
    fake: FakeBotFramework, model: FakeAnthropicAPI, answers: list[TeamsAnswer]
) -> list[float]:
    """Seconds from the model's last word of each answer to its reply's arrival."""
    tokens = token_times(model, [answer.mark for answer in answers])
    lags = []
    for answer in answers:
        replies = replies_to(fake, answer)
        if replies and answer.mark in tokens:
            lags.append(replies[0].received_at - tokens[answer.mark].last)
    return lags


def teams_figures(
    fake: FakeBotFramework, model: FakeAnthropicAPI, answers: list[TeamsAnswer]
) -> dict[str, Any]:
    """The Teams figures against their goals."""
    gaps: dict[str, float] = {}
    last: dict[str, float] = {}
    for conversation, at in list(fake.requests):
        if conversation in last:
            gap = at - last[conversation]
            gaps[conversation] = min(gap, gaps.get(conversation, gap))
        last[conversation] = at
    too_fast = len(fake.too_fast(GOAL_MIN_GAP_S))
    updates, finals = stream_ages(fake)
    overruns = sum(age > GOAL_STREAM_S for age in updates)
    replies = [len(replies_to(fake, answer)) for answer in answers]
    per_chat: Counter[str] = Counter(conversation for conversation, _at in fake.requests)
    min_gap = min(gaps.values(), default=None)
    return {
        "answers": len(answers),
        "accepted": sum(answer.accepted for answer in answers),
        "completed": sum(
            any(ANSWER_END in str(post.body.get("text") or "") for post in replies_to(fake, answer))
            for answer in answers
        ),
        "lost": sum(
            count == 0 for answer, count in zip(answers, replies, strict=True) if answer.accepted
        ),
        "duplicates": sum(max(count - 1, 0) for count in replies),
        "streams": len(fake.streams),
        "finished_with_final": len(fake.finals()),
        "min_gap_between_requests_to_one_chat_s": {
            "value": None if min_gap is None else round(min_gap, 3),
            "goal": f">= {GOAL_MIN_GAP_S:g}",
            "met": min_gap is None or min_gap >= GOAL_MIN_GAP_S,
        },
        "requests_under_1s_apart": count_goal(too_fast),
        "stream_updates_after_120s": {
            **count_goal(overruns),
            "latest_update_s": round(max(updates), 1) if updates else None,
            "latest_final_s": round(max(finals), 1) if finals else None,
        },
        "final_after_last_token_ms": percentiles_ms(final_lags(fake, model, answers)),
        "requests_per_answer": round(sum(per_chat.values()) / max(len(answers), 1), 2),
        "protocol_errors": list(fake.stream_errors),
    }
