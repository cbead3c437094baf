"""The measured run of `e2e.py` and its report: warm-up, the database probes, the load with
its samples, the wait for the replies, the audit for lost and duplicated messages, and the
figures (latencies, CPU per 1,000 messages, backlog, memory, goals) as one JSON object."""

from __future__ import annotations

import asyncio
import os
import platform
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from benchkit import progress
from e2e_database import (
    count_sessions,
    database_insert_rate,
    event_states,
    is_queued,
    wal_counters,
)
from e2e_load import ConnectionPool, LoadGenerator, PostCollector, Progress, Sent
from e2e_samples import (
    GatewaysCpu,
    backlog_summary,
    cpu_spent,
    memory_summary,
    per_1000,
    sample,
    total_rss_mb,
)
from e2e_settings import BenchSettings
from routing import (
    GatewayProcess,
    cpu_report,
    database_url,
    percentiles_ms,
    read_database_counters,
)

# Issue 15's goals: the first four for a closed loop with the instant model, the
# acknowledgements' for an open loop, the overhead's for an open loop with a slow model.
GOAL_MSGS_PER_S = 300.0
GOAL_GATEWAY_CPU_MS = 3.0
GOAL_COMMITS_PER_MESSAGE = 4.0
GOAL_RATIO_TO_DATABASE = 0.05
GOAL_ACK_P99_MS = 25.0
GOAL_OVERHEAD_P99_MS = 100.0


def wal_per_message(
    start: tuple[int, int] | None, end: tuple[int, int] | None, messages: int
) -> dict[str, float] | None:
    """The server's WAL flushes and kilobytes per measured message, from load to replies."""
    if start is None or end is None or messages <= 0:
        return None
    return {
        "flushes": round((end[0] - start[0]) / messages, 2),
        "kb": round((end[1] - start[1]) / messages / 1024, 2),
    }


def latency_figures(items: Sequence[Sent], posts: PostCollector, llm_s: float) -> dict[str, Any]:
    """ack, end-to-end and overhead percentiles over the answered measured messages."""
    acked = [item for item in items if item.error is None and item.ack_s is not None]
    e2e = [posts.at[i.token][0] - i.due_at for i in acked if i.token in posts.at]
    return {
        "ack_ms": percentiles_ms([item.ack_s for item in acked if item.ack_s is not None]),
        "e2e_ms": percentiles_ms(e2e),
        "overhead_ms": percentiles_ms([max(latency - llm_s, 0.0) for latency in e2e]),
    }


def audit(items: Sequence[Sent], posts: PostCollector, states: Mapping[str, str]) -> dict[str, Any]:
    """Lost, duplicated and unexpected replies over every event sent (warm-up included).

    An acknowledged event without a post is lost unless it was still queued in the gateway's
    database (`states`, read just before the last posts): a run that stops at `--timeout`
    before the gateway caught up leaves work queued, durably: a backlog, not a loss.
    """
    sent = {item.token: item for item in items}
    unanswered = [i.token for i in items if i.error is None and i.token not in posts.at]
    return {
        "lost": sum(1 for token in unanswered if not is_queued(states.get(token, "none/none"))),
        "unanswered_at_end": len(unanswered),
        "unanswered_by_inbox_outbox_status": dict(
            Counter(states.get(token, "none/none") for token in unanswered)
        ),
        "duplicates": sum(len(at) - 1 for at in posts.at.values() if len(at) > 1),
        "answered_after_error": sum(
            1 for i in items if i.error is not None and i.token in posts.at
        ),
        "unknown_tokens": sum(1 for token in posts.at if token not in sent),
        "unmatched_posts": len(posts.unmatched),
        "unmatched_examples": posts.unmatched[:3],
    }


async def run_load(
    settings: BenchSettings,
    gateways: Sequence[GatewayProcess],
    slack_url: str,
    database: str,
    probe_database: str,
) -> tuple[dict[str, Any], dict[str, float]]:
    """Warm up, probe the database, send the measured load, wait for the replies, audit.

    The figures, and PostgreSQL's counters for the gateways' database when the load started.
    """
    ports = [int(gateway.base_url.rsplit(":", 1)[1]) for gateway in gateways]
    pids = [gateway.process.pid for gateway in gateways]
    bench_db = database_url(settings.admin_url, database)
    probe_db = database_url(settings.admin_url, probe_database)
    posts = PostCollector(slack_url)
    follower = asyncio.create_task(posts.follow())
    rss_start = total_rss_mb(pids)
    try:
        warm_pool = ConnectionPool("127.0.0.1", ports, settings.concurrency)
        load = LoadGenerator(warm_pool, posts, settings.users, len(gateways))
        warm = load.plan(settings.warmup)
        progress(f"warm-up: {settings.warmup} messages, closed loop")
        await load.closed_loop(warm, wait_s=settings.timeout)
        await posts.wait_for(warm, deadline=time.monotonic() + settings.timeout)
        await warm_pool.close()

        progress(f"database probe: single-row INSERT+COMMIT for {settings.db_probe_seconds:g}s")
        db_before, db_method = await asyncio.to_thread(
            database_insert_rate, probe_db, settings.db_probe_seconds
        )
        counters = await asyncio.to_thread(read_database_counters, bench_db)

        items = load.plan(settings.messages)
        load.pool = ConnectionPool("127.0.0.1", ports, settings.concurrency)
        load.progress = Progress()
        mode = "closed loop" if settings.rate is None else f"{settings.rate:g}/s"
        progress(f"load: {settings.messages} messages, {settings.users} users, {mode}")
        samples: list[dict[str, float]] = []
        sampler = asyncio.create_task(sample(load, items, pids, bench_db, samples))
        load_average = os.getloadavg()
        wal_start = await asyncio.to_thread(wal_counters, bench_db)
        cpu_start = GatewaysCpu.take(gateways, database)
        started = time.perf_counter()
        started_wall = time.time()
        if settings.rate is None:
            await load.closed_loop(items, wait_s=settings.timeout)
        else:
            await load.open_loop(items, settings.rate)
        load_s = time.perf_counter() - started
        progress(f"sent in {load_s:.1f}s; waiting for the replies")
        complete = await posts.wait_for(items, deadline=time.monotonic() + settings.timeout)
        cpu_end = GatewaysCpu.take(gateways, database)
        wal_end = await asyncio.to_thread(wal_counters, bench_db)
        done_s = time.perf_counter() - started
        sampler.cancel()
        await asyncio.sleep(2.0)  # a second post for an event would show up now
        follower.cancel()
        await load.pool.close()
        sessions = await asyncio.to_thread(count_sessions, bench_db)
        await posts.fetch()
        unanswered = [
            i.token for i in [*warm, *items] if i.error is None and i.token not in posts.at
        ]
        # The states first, then the posts: a reply posted in between counts as answered.
        states = await asyncio.to_thread(event_states, bench_db, unanswered)
        await posts.fetch()
        rss_end = total_rss_mb(pids)

        progress("database probe again")
        db_after, _ = await asyncio.to_thread(
            database_insert_rate, probe_db, settings.db_probe_seconds
        )
    finally:
        follower.cancel()
        await posts.aclose()

    answered = [item for item in items if item.token in posts.at]
    last_post = max((posts.at[item.token][0] for item in answered), default=started_wall)
    sustained = len(answered) / max(last_post - started_wall, 1e-9)
    errors = Counter(item.error for item in items if item.error is not None)
    correctness = audit([*warm, *items], posts, states)
    events = Counter(load.gateway_for(item) for item in items)
    db_rate = (db_before + db_after) / 2
    latencies = latency_figures(items, posts, settings.llm_latency)
    cpu = cpu_report(cpu_start.machine, cpu_end.machine, wall=done_s, gateway_pid=pids[0])
    result = {
        "settings": {
            "users": settings.users,
            "gateways": settings.gateways,
            "mode": "closed" if settings.rate is None else "open",
            "rate": settings.rate,
            "concurrency": settings.concurrency,
            "messages": settings.messages,
            "warmup": settings.warmup,
            "llm_latency_s": settings.llm_latency,
            "profile": None if settings.profile is None else str(settings.profile),
            "config_overrides": dict(settings.overrides),
        },
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": [round(value, 2) for value in load_average],
            "load_average_at_end": [round(value, 2) for value in os.getloadavg()],
        },
        "sustained_msgs_per_s": round(sustained, 1),
        "sent_per_s": round(len(items) / load_s, 1),
        "load_s": round(load_s, 2),
        "all_answered_after_s": round(done_s, 2) if complete else None,
        **latencies,
        "cpu_s_per_1000_msgs": per_1000(
            cpu_spent(cpu_start.machine.gateway, cpu_end.machine.gateway), len(items)
        ),
        "cpu_s_per_1000_msgs_by_thread": {
            "event_loop": per_1000(cpu_end.event_loop_s() - cpu_start.event_loop_s(), len(items)),
            "other_threads": per_1000(
                cpu_end.other_threads_s() - cpu_start.other_threads_s(), len(items)
            ),
        },
        "gateway_peak_rss_mb": None,  # filled in once the gateways stopped
        "errors": sum(errors.values()) + correctness["unmatched_posts"],
        "error_kinds": dict(errors),
        "duplicates": correctness["duplicates"],
        "lost": correctness["lost"],
        "correctness": correctness,
        "database_insert_commit_per_s": round(db_rate, 1),
        "database_probe": {
            "method": db_method,
            "before_load_per_s": round(db_before, 1),
            "after_load_per_s": round(db_after, 1),
        },
        "ratio_msgs_per_s_to_db_inserts_per_s": round(sustained / db_rate, 3) if db_rate else None,
        "wal_per_message": wal_per_message(wal_start, wal_end, len(items)),
        "backlog": backlog_summary(samples, load_s=load_s, rate=settings.rate, messages=len(items)),
        "memory": {
            "sessions_in_database": sessions,
            **memory_summary(samples, rss_start=rss_start, rss_end=rss_end),
        },
        "cpu_during_load_pct_of_one_core": cpu,
        "cpu_ms_per_message_during_load": cpu_per_message(cpu, wall=done_s, messages=len(items)),
        "goals": None,  # filled in once the database's counters are read (`goals`)
        # Each gateway's CPU per 1,000 of all the measured messages: the entries add up to
        # `cpu_s_per_1000_msgs`. The rest is filled in once the gateways stopped.
        "per_gateway": [
            {
                "port": ports[number],
                "events": events[number],
                "cpu_s_per_1000_msgs": per_1000(
                    cpu_spent(cpu_start.each[number], cpu_end.each[number]), len(items)
                ),
                "cpu_s_per_1000_msgs_by_thread": {
                    "event_loop": per_1000(
                        cpu_end.threads[number][0] - cpu_start.threads[number][0], len(items)
                    ),
                    "other_threads": per_1000(
                        cpu_end.threads[number][1] - cpu_start.threads[number][1], len(items)
                    ),
                },
            }
            for number in range(len(gateways))
        ],
    }
    return result, counters


def cpu_per_message(cpu: Mapping[str, Any], *, wall: float, messages: int) -> dict[str, Any]:
    """`cpu_report`'s shares as CPU-ms per measured message: what each process spent on a
    message, the harness's processes (the fakes, moto, this generator) included, so that the
    machine's ceiling reads as the sum (`machine`: every core's busy time)."""

    def per_message(pct: float | None) -> float | None:
        return None if pct is None else round(pct / 100 * wall * 1000 / max(messages, 1), 2)

    return {
        "machine": per_message(cpu["machine_busy_pct"]),
        "gateway": per_message(cpu["gateway_pct"]),
        "bench": per_message(cpu["bench_pct"]),
        "others": {label: per_message(pct) for label, pct in cpu["others_pct"].items()},
        "unattributed": per_message(cpu["unattributed_pct"]),
    }


def goals(settings: BenchSettings, result: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's goals and whether this run met them (None: the goal is not for this kind
    of run)."""
    closed_instant = settings.rate is None and settings.llm_latency == 0
    open_loop = settings.rate is not None
    figures = {
        "msgs_per_s": (result["sustained_msgs_per_s"], GOAL_MSGS_PER_S, closed_instant),
        "gateway_cpu_ms_per_message": (
            result["cpu_s_per_1000_msgs"],  # CPU-s per 1,000 messages: CPU-ms per message
            GOAL_GATEWAY_CPU_MS,
            closed_instant,
        ),
        "commits_per_message": (
            (result.get("database_work_per_message") or {}).get("commits"),
            GOAL_COMMITS_PER_MESSAGE,
            closed_instant,
        ),
        "ratio_to_database": (
            result["ratio_msgs_per_s_to_db_inserts_per_s"],
            GOAL_RATIO_TO_DATABASE,
            closed_instant,
        ),
        "ack_p99_ms": (result["ack_ms"]["p99"], GOAL_ACK_P99_MS, open_loop),
        "overhead_p99_ms": (
            result["overhead_ms"]["p99"],
            GOAL_OVERHEAD_P99_MS,
            open_loop and settings.llm_latency > 0,
        ),
    }
    at_least = {"msgs_per_s", "ratio_to_database"}  # the others are ceilings
    report: dict[str, Any] = {name: goal for name, (_, goal, _) in figures.items()}
    for name, (value, goal, applies) in figures.items():
        met = None
        if applies and value is not None:
            met = value >= goal if name in at_least else value <= goal
        report[f"{name.removesuffix('_ms')}_met"] = met  # ack_p99_met, as the keys were
    return report
