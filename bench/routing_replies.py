"""The replies: each user's feed followed with its cursor until every accepted message was
answered, and the final read of every feed that finds what was lost, answered twice, answered
to the wrong user or answered without being asked."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchkit import progress
from routing_http import (
    FEED_PAGE,
    Ack,
    Connections,
    read_feed_page,
    read_whole_feed,
    turns_completed,
)


def expected_by_user(acks: Sequence[Ack]) -> dict[str, set[str]]:
    """The accepted message ids, by user."""
    expected: dict[str, set[str]] = {}
    for ack in acks:
        if ack.accepted:
            expected.setdefault(ack.user, set()).add(ack.message_id)
    return expected


@dataclass
class FeedFollower:
    """Follows each user's reply feed with its cursor, noting when each reply was first seen."""

    connections: Connections
    cursors: dict[str, str] = field(default_factory=dict)
    seen_at: dict[str, float] = field(default_factory=dict)  # in_reply_to → perf_counter()

    async def read(self, user: str) -> None:
        """Read the user's feed from the cursor to its end."""
        async with self.connections.connection() as client:
            while True:
                messages, cursor = await read_feed_page(client, user, self.cursors.get(user, ""))
                arrived = time.perf_counter()
                self.cursors[user] = cursor
                for message in messages:
                    key = message.get("in_reply_to")
                    if isinstance(key, str):
                        self.seen_at.setdefault(key, arrived)
                if len(messages) < FEED_PAGE:
                    return

    async def wait_for(
        self, expected: dict[str, set[str]], *, turns_target: int | None, deadline: float
    ) -> float | None:
        """Read until every expected reply was seen; when the last one was (None: deadline).

        Reading every feed in a loop would take the gateway's CPU from the turns being waited
        for, so the feeds are read every 5 s, and then every second from the moment the
        gateway's `/metrics` count `turns_target` finished turns; the count only says when to
        look, the feeds alone say what was answered.
        """
        total = sum(len(ids) for ids in expected.values())
        last_pass = reported = time.perf_counter()
        turns_reached = False
        while True:
            waiting = [u for u, ids in expected.items() if not ids <= self.seen_at.keys()]
            if not waiting:
                seen = [self.seen_at[i] for ids in expected.values() for i in ids]
                return max(seen, default=time.perf_counter())
            now = time.perf_counter()
            if now > deadline:
                return None
            turns = await turns_completed(self.connections)
            due = last_pass + (1.0 if turns_reached else 5.0)
            if turns_target is None or (turns is not None and turns >= turns_target):
                due = now if not turns_reached else due
                turns_reached = True
            if now >= due:
                await asyncio.gather(*(self.read(user) for user in waiting))
                last_pass = time.perf_counter()
            if now - reported > 10.0:
                done = sum(len(ids & self.seen_at.keys()) for ids in expected.values())
                progress(f"{done}/{total} replies seen, {turns} turns finished in all")
                reported = now
            await asyncio.sleep(0.25)


@dataclass(frozen=True, slots=True)
class Audit:
    """The replies in every user's feed, checked against the messages sent."""

    replied: frozenset[str]
    lost: int
    duplicates: int
    misrouted: int
    unexpected: int
    replied_after_error: int


async def audit_feeds(connections: Connections, acks: Sequence[Ack]) -> Audit:
    """Read each user's whole feed: every accepted message must have exactly one reply there."""
    sender = {ack.message_id: ack.user for ack in acks}
    users = sorted(set(sender.values()))
    feeds = await asyncio.gather(*(read_whole_feed(connections, user) for user in users))
    replies: Counter[str] = Counter()
    misrouted = unexpected = 0
    for user, feed in zip(users, feeds, strict=True):
        for message in feed:
            key = message.get("in_reply_to")
            if not isinstance(key, str) or key not in sender:
                unexpected += 1
            elif sender[key] != user:
                misrouted += 1
            else:
                replies[key] += 1
    accepted = {ack.message_id for ack in acks if ack.accepted}
    return Audit(
        replied=frozenset(replies),
        lost=sum(1 for message_id in accepted if replies[message_id] == 0),
        duplicates=sum(count - 1 for count in replies.values() if count > 1),
        misrouted=misrouted,
        unexpected=unexpected,
        replied_after_error=sum(1 for message_id in replies if message_id not in accepted),
    )
