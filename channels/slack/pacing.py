"""Slack's rate limits, shared by every live reply of a workspace.

Slack limits each Web API method per app per workspace (docs.slack.dev, "Rate limits"):
`chat.appendStream` is Tier 4 (100+ a minute), `chat.update` Tier 3 (50+), `chat.stopStream`
Tier 2 (20+; `chat.startStream` is taken to be the same); `assistant.threads.setStatus` has a
special limit of about one a second per thread. One answer updated once a second stays well
inside these, but fifty answers written at once would make fifty appends a second. So the
optional calls of live replies (appending, replacing, starting a stream instead of posting)
draw from one token bucket per workspace and method: while a workspace has few live replies
each gets every update it asks for; with many, each one is updated less often, and the final
send (which is not paced) still delivers every answer in full. Starting streams at most at
Tier 2's pace also keeps the `chat.stopStream` calls that finish them within it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from primitives.bounded_cache import BoundedCache

# Calls a minute per workspace that live replies may make, per method (Slack's tier minimum).
LIVE_BUDGETS: Mapping[str, int] = {
    "chat.appendStream": 100,
    "chat.update": 50,
    "chat.startStream": 20,
}
BURST_SECONDS = 10.0  # a bucket holds this many seconds' worth of calls
WORKSPACES = 1024  # workspaces whose buckets are kept


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class SlackPacer:
    """Token buckets per (workspace, method): `take` says whether a call may go now."""

    def __init__(
        self,
        budgets: Mapping[str, int] = LIVE_BUDGETS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budgets = dict(budgets)
        self._clock = clock
        self._buckets: BoundedCache[tuple[str, str], _Bucket] = BoundedCache(
            WORKSPACES * max(len(self.budgets), 1)
        )

    def take(self, team: str, method: str) -> bool:
        """Spend one call of `method` in `team` if the budget has one; methods without a
        budget are not paced."""
        per_minute = self.budgets.get(method)
        if per_minute is None:
            return True
        rate, capacity = per_minute / 60.0, max(per_minute * BURST_SECONDS / 60.0, 1.0)
        now = self._clock()
        bucket = self._buckets.get((team, method))
        if bucket is None:
            bucket = _Bucket(tokens=capacity, at=now)
            self._buckets.put((team, method), bucket)
        bucket.tokens = min(capacity, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True
