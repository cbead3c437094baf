"""One measured run against a started gateway: the warm-up, the load, the wait for the
replies and the audit, and the figures they give (the JSON object, but for what `main` adds
once the gateway stopped: the database's work, peak RSS, exit code and log lines)."""

from __future__ import annotations

import asyncio
import math
import os
import platform
import secrets
import ssl
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from benchkit import progress
from routing_cpu import CpuSnapshot, cpu_report
from routing_database import database_url, read_database_counters
from routing_gateway import GatewayProcess
from routing_http import Ack, Connections, send_closed_loop, send_open_loop, turns_completed
from routing_replies import FeedFollower, audit_feeds, expected_by_user
from routing_settings import BenchSettings

FEED_READERS = 8  # feeds read at once while waiting for replies
GOAL_ACCEPTED_PER_S = 500.0
GOAL_ACK_P99_MS = 50.0


def percentiles_ms(latencies: Sequence[float]) -> dict[str, float | None]:
    """Nearest-rank p50/p90/p99 and the maximum, in milliseconds."""
    ordered = sorted(latencies)
    if not ordered:
        return {"p50": None, "p90": None, "p99": None, "max": None}

    def rank(q: float) -> float:
        return round(ordered[max(math.ceil(q * len(ordered)) - 1, 0)] * 1000, 2)

    return {"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": rank(1.0)}


def _turns_target(turns_before: int | None, acks: Sequence[Ack]) -> int | None:
    """The gateway's finished-turns count once each accepted message had its turn."""
    return None if turns_before is None else turns_before + sum(1 for a in acks if a.accepted)


def plan_messages(prefix: str, count: int, users: Sequence[str]) -> list[tuple[str, str]]:
    """(user, message id) pairs, round-robin over the users."""
    return [(users[n % len(users)], f"{prefix}-{n:06d}") for n in range(count)]


async def run_load(
    settings: BenchSettings, gateway: GatewayProcess, users: Sequence[str], database: str
) -> tuple[dict[str, Any], dict[str, float]]:
    """Warm up, send the measured load, wait for the replies, audit.

    The figures, and the database's counters when the measured load started.
    """
    run_id = secrets.token_hex(3)
    benchmark_database_url = database_url(settings.admin_url, database)
    tls = ssl.create_default_context()
    load_average = round(os.getloadavg()[0], 2)
    async with Connections(gateway.base_url, FEED_READERS, tls) as readers:
        follower = FeedFollower(readers)
        progress(f"warm-up: {settings.warmup} messages")
        turns_before_warmup = await turns_completed(readers)
        async with Connections(gateway.base_url, settings.concurrency, tls) as warm_connections:
            warm_plan = plan_messages(f"w{run_id}", settings.warmup, users)
            warm = await send_closed_loop(warm_connections, warm_plan)
        deadline = time.perf_counter() + settings.timeout
        warm_expected = expected_by_user(warm)
        warm_target = _turns_target(turns_before_warmup, warm)
        if (
            await follower.wait_for(warm_expected, turns_target=warm_target, deadline=deadline)
            is None
        ):
            progress("the warm-up's replies are incomplete at the deadline; measuring anyway")
        turns_before = await turns_completed(readers)

        # Fresh connections: the warm-up's idled past uvicorn's 5 s keep-alive while the
        # replies came, and a request sent just as the server closes one fails.
        plan = plan_messages(f"m{run_id}", settings.messages, users)
        mode = "closed loop" if settings.rate is None else f"open loop at {settings.rate:g}/s"
        progress(f"load: {settings.messages} messages, {len(users)} users, {mode}")
        counters = await asyncio.to_thread(read_database_counters, benchmark_database_url)
        async with Connections(gateway.base_url, settings.concurrency, tls) as connections:
            cpu_start = CpuSnapshot.take(gateway, database)
            started = time.perf_counter()
            if settings.rate is None:
                acks = await send_closed_loop(connections, plan)
            else:
                acks = await send_open_loop(connections, plan, settings.rate)
            load_s = time.perf_counter() - started
            cpu_end = CpuSnapshot.take(gateway, database)
        turns_at_load_end = await turns_completed(readers)

        progress(f"load sent in {load_s:.2f}s; waiting for the replies")
        expected = expected_by_user(acks)
        deadline = time.perf_counter() + settings.timeout
        target = _turns_target(turns_before, acks)
        last_reply = await follower.wait_for(expected, turns_target=target, deadline=deadline)
        gateway_done = gateway.sample()

        await asyncio.sleep(1.0)  # a surplus reply committed just after the last one shows now
        await asyncio.gather(*(follower.read(user) for user in users))  # the cursors' last word
        audit = await audit_feeds(readers, [*warm, *acks])

    accepted = [ack for ack in acks if ack.accepted]
    accepted_per_s = len(accepted) / load_s
    ack_ms = percentiles_ms([ack.latency_s for ack in accepted])
    completion_s = None if last_reply is None else last_reply - started
    replied = sum(len(ids & follower.seen_at.keys()) for ids in expected.values())
    errors = Counter(ack.error for ack in acks if ack.error is not None)
    gateway_cpu_s = None
    if cpu_start.gateway.cpu_s is not None and gateway_done.cpu_s is not None:
        gateway_cpu_s = round(gateway_done.cpu_s - cpu_start.gateway.cpu_s, 2)
    result = {
        "settings": {
            "messages": settings.messages,
            "users": len(users),
            "mode": "closed" if settings.rate is None else "open",
            "concurrency": settings.concurrency,
            "rate": settings.rate,
            "warmup": settings.warmup,
            "timeout_s": settings.timeout,
            "gateway_under_cprofile": settings.profile is not None,
            "config_overrides": dict(settings.overrides),
        },
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1min_at_start": load_average,
        },
        "accepted": len(accepted),
        "load_s": round(load_s, 3),
        "accepted_per_s": round(accepted_per_s, 1),
        "ack_ms": ack_ms,
        "ack_measured_from": "send" if settings.rate is None else "due time",
        "send_delay_ms_max": round(max((a.send_delay_s for a in acks), default=0.0) * 1000, 2),
        "replies_committed_at_load_end": (
            None
            if turns_before is None or turns_at_load_end is None
            else turns_at_load_end - turns_before
        ),
        "replied": replied,
        "completion_s": None if completion_s is None else round(completion_s, 3),
        "replies_per_s": None if not completion_s else round(replied / completion_s, 1),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "acked_as_duplicate": sum(1 for ack in accepted if ack.duplicate),
        "lost": audit.lost,
        "duplicates": audit.duplicates,
        "misrouted": audit.misrouted,
        "unexpected_replies": audit.unexpected,
        "replied_after_error": audit.replied_after_error,
        "skipped_by_cursor": len(audit.replied - follower.seen_at.keys()),
        "cpu_during_load_pct_of_one_core": cpu_report(
            cpu_start, cpu_end, wall=load_s, gateway_pid=gateway.process.pid
        ),
        "gateway_cpu_s": gateway_cpu_s,
        "goals": {
            "accepted_per_s": GOAL_ACCEPTED_PER_S,
            "ack_p99_ms": GOAL_ACK_P99_MS,
            "met": accepted_per_s >= GOAL_ACCEPTED_PER_S
            and ack_ms["p99"] is not None
            and ack_ms["p99"] <= GOAL_ACK_P99_MS,
        },
    }
    return result, counters
