"""The web half of the live-replies benchmark: every user keeps the event stream open
(`GET /web/v1/messages`, `Accept: text/event-stream`) and posts a message, all at once (a wave).

Per message: the status (the POST's 202 → the first `status` event for it), the first visible
text (the model's first text delta → the first `text` event), and its `message` event (the
committed reply). Lost and duplicated replies are counted from each user's whole JSON feed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from benchkit import progress
from live_figures import latency_goal, marker, message_text, percentiles_ms, token_times

from tests.fakes.anthropic_api import FakeAnthropicAPI

GOAL_FIRST_TEXT_MS = 500.0
GOAL_STATUS_MS = 300.0


def web_user(user: int) -> str:
    """The benchmark's web user `user` (its gateway id and web id)."""
    return f"w{user:05d}"


def web_identities(streams: int) -> list[dict[str, Any]]:
    """The benchmark's web users."""
    return [{"id": web_user(n), "org": "acme"} for n in range(streams)]


@dataclass
class WebAnswer:
    """One message a user posted and what their event stream showed of its answer
    (`time.monotonic()` of each)."""

    user: int
    wave: int
    mark: str
    accepted_at: float | None = None
    error: str | None = None
    status_at: float | None = None
    text_at: float | None = None
    message_at: float | None = None
    events: Counter[str] = field(default_factory=Counter)

    @property
    def message_id(self) -> str:
        return f"live-{self.wave:03d}-{self.user:05d}"


class EventReader:
    """One user's event stream, reconnected from its cursor whenever it ends, noting the first
    event of each kind per message."""

    def __init__(self, client: httpx.AsyncClient, user: str) -> None:
        self.client = client
        self.user = user
        self.cursor = "0"
        self.answers: dict[str, WebAnswer] = {}
        self.opened = asyncio.Event()

    async def run(self) -> None:
        """Read until cancelled."""
        while True:
            try:
                await self._read_once()
            except httpx.HTTPError as exc:
                progress(f"web: the stream of {self.user} broke ({exc!r}); reconnecting")
                await asyncio.sleep(0.1)

    async def _read_once(self) -> None:
        params = {"user": self.user, "after": self.cursor}
        headers = {"Accept": "text/event-stream"}
        async with self.client.stream(
            "GET", "/web/v1/messages", params=params, headers=headers
        ) as response:
            response.raise_for_status()
            self.opened.set()
            event, event_id, data = "", None, ""
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("data:"):
                    data += line[5:].strip()
                elif not line and event:
                    self._seen(event, event_id, data)
                    event, event_id, data = "", None, ""

    def _seen(self, event: str, event_id: str | None, data: str) -> None:
        now = time.monotonic()
        body = json.loads(data) if data else {}
        if event == "message" and event_id is not None:
            self.cursor = event_id
        answer = self.answers.get(str(body.get("in_reply_to") or ""))
        if answer is None:
            return
        answer.events[event] += 1
        if event == "status" and answer.status_at is None:
            answer.status_at = now
        elif event == "text" and answer.text_at is None:
            answer.text_at = now
        elif event == "message" and answer.message_at is None:
            answer.message_at = now


async def post(client: httpx.AsyncClient, answer: WebAnswer) -> None:
    """POST the message; note when the 202 came."""
    body = {
        "user": web_user(answer.user),
        "text": message_text(answer.mark),
        "message_id": answer.message_id,
    }
    try:
        response = await client.post("/web/v1/messages", json=body)
    except httpx.HTTPError as exc:
        answer.error = repr(exc)
        return
    if response.status_code == 202:
        answer.accepted_at = time.monotonic()
    else:
        answer.error = f"HTTP {response.status_code}"


async def wait_for_messages(answers: list[WebAnswer], wait_s: float) -> None:
    """Until every accepted message's reply came over its stream (or the timeout passed)."""
    deadline = time.monotonic() + wait_s
    while any(a.accepted_at is not None and a.message_at is None for a in answers):
        if time.monotonic() > deadline:
            progress("web: some replies did not arrive over the stream in time")
            return
        await asyncio.sleep(0.05)


async def run_waves(
    base_url: str, *, streams: int, waves: int, wait_s: float
) -> tuple[list[WebAnswer], dict[str, Counter[str]]]:
    """The waves one after the other with every user's stream open; then each user's whole
    feed (replies per message id)."""
    answers: list[WebAnswer] = []
    limits = httpx.Limits(max_connections=2 * streams + 4, max_keepalive_connections=streams)
    timeout_config = httpx.Timeout(30, read=60)
    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=timeout_config
    ) as client:
        readers = [EventReader(client, web_user(user)) for user in range(streams)]
        tasks = [asyncio.create_task(reader.run()) for reader in readers]
        try:
            await asyncio.wait_for(
                asyncio.gather(*(reader.opened.wait() for reader in readers)), timeout=30
            )
            for wave in range(1, waves + 1):
                progress(f"web: wave {wave} of {waves}, {streams} event streams")
                sent = [WebAnswer(user, wave, marker("w", user, wave)) for user in range(streams)]
                for answer, reader in zip(sent, readers, strict=True):
                    reader.answers[answer.message_id] = answer
                await asyncio.gather(*(post(client, answer) for answer in sent))
                answers += sent
                await wait_for_messages(sent, wait_s)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        feeds = {
            web_user(user): await feed_replies(client, web_user(user)) for user in range(streams)
        }
    return answers, feeds


async def feed_replies(client: httpx.AsyncClient, user: str) -> Counter[str]:
    """How many replies each message of `user` has in the whole JSON feed."""
    replies: Counter[str] = Counter()
    cursor = ""
    while True:
        params = {"user": user, "after": cursor, "limit": "100"}
        response = await client.get("/web/v1/messages", params=params)
        response.raise_for_status()
        page = response.json()
        replies.update(str(item.get("in_reply_to")) for item in page["messages"])
        cursor = str(page["cursor"])
        if len(page["messages"]) < 100:
            return replies


def web_records(
    model: FakeAnthropicAPI, answers: list[WebAnswer], feeds: dict[str, Counter[str]]
) -> list[dict[str, Any]]:
    """Every answer's timeline (`time.monotonic()` seconds) and counts, for the figures and
    for `--details`."""
    tokens = token_times(model, [answer.mark for answer in answers])
    records = []
    for answer in answers:
        times = tokens.get(answer.mark)
        records.append(
            {
                "user": answer.user,
                "wave": answer.wave,
                "accepted_at": answer.accepted_at,
                "status_at": answer.status_at,
                "first_token_at": times.first if times else None,
                "text_at": answer.text_at,
                "last_token_at": times.last if times else None,
                "message_at": answer.message_at,
                "events": dict(answer.events),
                "replies": feeds[web_user(answer.user)][answer.message_id],
            }
        )
    return records


def _gaps(records: list[dict[str, Any]], start: str, end: str) -> list[float]:
    return [
        record[end] - record[start]
        for record in records
        if record[start] is not None and record[end] is not None
    ]


def web_figures(
    model: FakeAnthropicAPI, answers: list[WebAnswer], feeds: dict[str, Counter[str]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The web figures against their goals, and every answer's record."""
    records = web_records(model, answers, feeds)
    events: Counter[str] = Counter()
    for answer in answers:
        events.update(answer.events)
    return {
        "answers": len(answers),
        "accepted": sum(record["accepted_at"] is not None for record in records),
        "completed": sum(record["replies"] >= 1 for record in records),
        "lost": sum(
            record["replies"] == 0 and record["accepted_at"] is not None for record in records
        ),
        "duplicates": sum(max(record["replies"] - 1, 0) for record in records),
        "over_the_stream": sum(record["message_at"] is not None for record in records),
        "first_visible_text_after_first_token_ms": latency_goal(
            _gaps(records, "first_token_at", "text_at"), GOAL_FIRST_TEXT_MS
        ),
        "status_after_202_ms": latency_goal(
            _gaps(records, "accepted_at", "status_at"), GOAL_STATUS_MS
        ),
        "final_message_after_last_token_ms": percentiles_ms(
            _gaps(records, "last_token_at", "message_at")
        ),
        "events_per_answer": {
            kind: round(count / max(len(answers), 1), 2) for kind, count in events.most_common()
        },
    }, records
