"""What the live-replies benchmark derives from the fakes' records: latency percentiles held
against a goal, the marker that ties a user's message to the model's answer, and when the fake
model sent the first word of each answer."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tests.fakes.anthropic_api import FakeAnthropicAPI, is_bookkeeping

MARKER = re.compile(r"bench-[a-z]\d{5}-w\d+")


def marker(kind: str, user: int, wave: int) -> str:
    """The token a message carries so that its model request can be found (`MARKER`):
    `kind` is one letter per channel (s, t, w)."""
    return f"bench-{kind}{user:05d}-w{wave}"


def message_text(mark: str) -> str:
    """What a benchmark user writes: the marker first, so that the model's echo keeps it."""
    return f"{mark} please explain how live replies show an answer while it is written"


def percentiles_ms(values_s: Sequence[float]) -> dict[str, Any]:
    """Nearest-rank p50/p95 and the maximum in milliseconds, and how many values."""
    ordered = sorted(values_s)
    if not ordered:
        return {"n": 0, "p50": None, "p95": None, "max": None}

    def rank(q: float) -> float:
        return round(ordered[max(math.ceil(q * len(ordered)) - 1, 0)] * 1000, 1)

    return {"n": len(ordered), "p50": rank(0.50), "p95": rank(0.95), "max": rank(1.0)}


def latency_goal(values_s: Sequence[float], goal_ms: float) -> dict[str, Any]:
    """The percentiles, the goal (p95 at most `goal_ms`) and whether it was met; a figure with
    no values did not meet it."""
    figures = percentiles_ms(values_s)
    p95 = figures["p95"]
    return {**figures, "goal": f"p95 <= {goal_ms:g} ms", "met": p95 is not None and p95 <= goal_ms}


def count_goal(value: int, goal: int = 0) -> dict[str, Any]:
    """A count that must stay at or below `goal`."""
    return {"value": value, "goal": f"<= {goal}", "met": value <= goal}


@dataclass(frozen=True, slots=True)
class TokenTimes:
    """When the fake model sent an answer's first and last text delta (`time.monotonic()`)."""

    first: float
    last: float


def token_times(api: FakeAnthropicAPI, marks: Iterable[str]) -> dict[str, TokenTimes]:
    """For each marker, when the fake model sent the first and the last text delta of the
    streamed turn requests whose last message carries it (`sent` is in time order)."""
    wanted = set(marks)
    request_of: dict[int, str] = {}
    for number, body in enumerate(list(api.requests)):
        if not body.get("stream") or is_bookkeeping(body) or not body.get("messages"):
            continue
        found = MARKER.search(json.dumps(body["messages"][-1]))
        if found is not None and found.group() in wanted:
            request_of[number] = found.group()
    times: dict[str, TokenTimes] = {}
    for event in list(api.sent):
        mark = request_of.get(event.request)
        if mark is not None and event.text:
            first = times[mark].first if mark in times else event.at
            times[mark] = TokenTimes(first, event.at)
    return times


def mean(values: Sequence[float]) -> float | None:
    """The arithmetic mean, rounded; None without values."""
    return round(sum(values) / len(values), 3) if values else None
