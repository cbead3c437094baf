"""What `e2e.py` samples of the gateways while the load runs: CPU (per thread, turn workers
included, from /proc), RSS and the sessions in the database every second, and the summaries
of those samples (the backlog's growth, what a new session costs in memory)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from e2e_gateways import turn_workers
from e2e_load import LoadGenerator, Sent
from routing import (
    CpuSnapshot,
    GatewayProcess,
    ProcessSample,
    cpu_by_process,
    read_machine_ticks,
    read_process,
)

SAMPLE_SECONDS = 1.0  # backlog and RSS samples


def read_thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of a process's main thread (the event loop) and of its other threads
    (`asyncio.to_thread` workers: boto3, DNS), from /proc/PID/task."""
    main = others = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (task / "stat").read_text(encoding="ascii", errors="replace")
                fields = stat.rsplit(")", 1)[1].split()
                spent = (int(fields[11]) + int(fields[12])) / ticks
                if task.name == str(pid):
                    main += spent
                else:
                    others += spent  # threads that ended are lost: their CPU is not counted
    return main, others


def threads_cpu(pids: Sequence[int]) -> tuple[float, float]:
    """`read_thread_cpu` of several processes added up."""
    main = others = 0.0
    for pid in pids:
        loop, rest = read_thread_cpu(pid)
        main, others = main + loop, others + rest
    return main, others


def read_rss_mb(pid: int) -> float | None:
    """Resident memory now (VmRSS), in MB."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def total_rss_mb(pids: Sequence[int]) -> float | None:
    """The resident memory of these processes together (those still readable), in MB."""
    readable = [rss for rss in map(read_rss_mb, pids) if rss is not None]
    return sum(readable) if readable else None


def together(samples: Sequence[ProcessSample]) -> ProcessSample:
    """Several processes as one: CPU summed (None when one is unreadable), the largest peak RSS."""
    cpu = [sample.cpu_s for sample in samples]
    peaks = [sample.peak_rss_mb for sample in samples if sample.peak_rss_mb is not None]
    return ProcessSample(
        None if None in cpu else sum(value for value in cpu if value is not None),
        max(peaks, default=None),
        sum(sample.ended_children_cpu_s for sample in samples),
    )


@dataclass(frozen=True, slots=True)
class GatewaysCpu:
    """The gateways' CPU counters at one moment, each one's and (in `machine`, for
    `cpu_report`) all of them as one gateway, with every other process on the machine."""

    machine: CpuSnapshot
    each: tuple[ProcessSample, ...]
    threads: tuple[tuple[float, float], ...]  # (event loop, other threads) of each gateway

    @classmethod
    def take(cls, gateways: Sequence[GatewayProcess], database: str) -> GatewaysCpu:
        """The counters now (`database`: the gateways' database, for the process labels).

        A gateway's turn workers (`server.turn_workers`, its children) count as part of it.
        """
        workers = {gateway.process.pid: turn_workers(gateway.process.pid) for gateway in gateways}
        each = tuple(
            together([gateway.sample(), *map(read_process, workers[gateway.process.pid])])
            for gateway in gateways
        )
        threads = tuple(
            threads_cpu([gateway.process.pid, *workers[gateway.process.pid]])
            for gateway in gateways
        )
        pids = {gateway.process.pid for gateway in gateways}
        pids |= {pid for found in workers.values() for pid in found}
        processes = cpu_by_process(database)
        machine = CpuSnapshot(
            gateway=together(each),
            bench_s=time.process_time(),
            machine=read_machine_ticks(),
            # `cpu_report` leaves one gateway out of the others: leave them all out.
            processes={pid: entry for pid, entry in processes.items() if pid not in pids},
        )
        return cls(machine, each, threads)

    def event_loop_s(self) -> float:
        """The event loops' CPU seconds, all gateways together."""
        return sum(main for main, _ in self.threads)

    def other_threads_s(self) -> float:
        """The other threads' CPU seconds, all gateways together."""
        return sum(others for _, others in self.threads)


def cpu_spent(start: ProcessSample, end: ProcessSample) -> float | None:
    """CPU seconds between two samples of one process (None when either was unreadable)."""
    if start.cpu_s is None or end.cpu_s is None:
        return None
    return end.cpu_s - start.cpu_s


def per_1000(seconds: float | None, messages: int) -> float | None:
    """CPU seconds per 1,000 messages, rounded."""
    return None if seconds is None else round(seconds / messages * 1000, 2)


async def sample(
    load: LoadGenerator,
    items: Sequence[Sent],
    pids: Sequence[int],
    database: str,
    samples: list[dict[str, float]],
) -> None:
    """Every second: messages due and answered so far, sessions in the database, the gateways'
    RSS (summed)."""
    started = time.monotonic()
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as connection:
        while True:
            answered = sum(1 for item in items if item.token in load.posts.at)
            row = await (await connection.execute("SELECT count(*) FROM sessions")).fetchone()
            samples.append(
                {
                    "t": round(time.monotonic() - started, 2),
                    "due": load.progress.due,
                    "answered": answered,
                    "backlog": load.progress.due - answered,
                    "sessions": int(row[0]) if row else 0,
                    "rss_mb": round(total_rss_mb(pids) or 0.0, 1),
                }
            )
            await asyncio.sleep(SAMPLE_SECONDS)


def thin(rows: Sequence[Any], most: int = 40) -> list[Any]:
    """At most about `most` evenly spaced rows, the last one included."""
    step = max(math.ceil(len(rows) / most), 1)
    kept = list(rows[::step])
    if rows and kept[-1] is not rows[-1]:
        kept.append(rows[-1])
    return kept


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x."""
    if len(points) < 3:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def backlog_summary(
    samples: Sequence[dict[str, float]], *, load_s: float, rate: float | None, messages: int
) -> dict[str, Any]:
    """The backlog while sending, and whether it grew over the second half of the sending
    (in open loop, the schedule's: the last sends may wait for connections long after)."""
    window = load_s if rate is None else messages / rate
    during = [s for s in samples if s["t"] <= window]
    second_half = [(s["t"], s["backlog"]) for s in during if s["t"] >= window / 2]
    growth = slope(second_half)
    return {
        "max": max((s["backlog"] for s in during), default=None),
        "at_load_end": during[-1]["backlog"] if during else None,
        "slope_msgs_per_s_second_half": None if growth is None else round(growth, 2),
        # Open loop only: growing by more than 2 % of the rate means the rate is not sustained.
        "growing": None if rate is None or growth is None else growth > 0.02 * rate,
        "samples_t_due_answered": [[s["t"], s["due"], s["answered"]] for s in thin(samples)],
    }


def memory_summary(
    samples: Sequence[dict[str, float]], *, rss_start: float | None, rss_end: float | None
) -> dict[str, Any]:
    """RSS against the sessions in the database: what one more (then idle) session costs,
    and whether memory still grows once no new session appears."""
    if not samples:
        return {}
    last = samples[-1]
    first_all = next(s for s in samples if s["sessions"] >= last["sessions"])
    growing = [(s["sessions"], s["rss_mb"]) for s in samples if s["t"] <= first_all["t"]]
    per_session = slope(growing)
    return {
        "rss_mb_gateway_started": None if rss_start is None else round(rss_start, 1),
        "rss_mb_load_start": samples[0]["rss_mb"],
        "rss_mb_when_sessions_stopped_growing": first_all["rss_mb"],
        "rss_mb_end": None if rss_end is None else round(rss_end, 1),
        "sessions_at_load_start": int(samples[0]["sessions"]),
        "sessions_at_end": int(last["sessions"]),
        # Least squares over the samples while sessions were being created.
        "rss_kb_per_new_session": None if per_session is None else round(per_session * 1024, 2),
        "rss_mb_growth_after_sessions_stopped_growing": round(
            last["rss_mb"] - first_all["rss_mb"], 1
        ),
        "samples_t_sessions_rss_mb": [[s["t"], s["sessions"], s["rss_mb"]] for s in thin(samples)],
    }
