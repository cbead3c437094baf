"""CPU and memory, from /proc: a process's CPU seconds and peak RSS, every process on the
machine by what it is (PostgreSQL's backends, this program, other people's test runs), and
who used the cores during the load (`cpu_during_load_pct_of_one_core`)."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from routing_gateway import GatewayProcess


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """CPU seconds and peak RSS of one process, read from /proc (None when unreadable).

    `ended_children_cpu_s` is the CPU of its children that ended and were waited for.
    """

    cpu_s: float | None
    peak_rss_mb: float | None
    ended_children_cpu_s: float = 0.0


def read_process(pid: int) -> ProcessSample:
    """User+system CPU seconds (/proc/PID/stat) and peak RSS (VmHWM) of a live process."""
    cpu_s = peak_rss_mb = None
    children_s = 0.0
    with contextlib.suppress(OSError, IndexError, ValueError):
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces and brackets
        ticks = os.sysconf("SC_CLK_TCK")
        cpu_s = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
        children_s = (int(fields[13]) + int(fields[14])) / ticks  # cutime + cstime
    with contextlib.suppress(OSError, IndexError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                peak_rss_mb = int(line.split()[1]) / 1024
    return ProcessSample(cpu_s, peak_rss_mb, children_s)


POSTGRES_SERVER = "postgres: server and ended backends"


def cpu_by_process(database: str) -> dict[int, tuple[str, float]]:
    """What each process on the machine is (see `process_label`) and its CPU seconds.

    The PostgreSQL server's figure includes its ended children: the backends of short-lived
    connections end between two snapshots, and their CPU shows in the postmaster that reaped
    them. (Other processes' ended children are left out: they may have started long before.)
    """
    processes: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        label = process_label(pid, database)
        sample = read_process(pid)
        if label is not None and sample.cpu_s is not None:
            children_s = sample.ended_children_cpu_s if label == POSTGRES_SERVER else 0.0
            processes[pid] = (label, sample.cpu_s + children_s)
    return processes


def process_label(pid: int, database: str) -> str | None:
    """What a process is, briefly (`postgres: this database`, `pytest` …); None for threads."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    argv = [arg for arg in raw.decode(errors="replace").split("\0") if arg]
    if not argv:
        return None
    if argv[0].startswith("postgres:"):  # backends retitle themselves "postgres: … DB host …"
        return "postgres: this database" if f" {database} " in argv[0] else "postgres: other"
    name = Path(argv[0].split()[0]).name
    if name == "postgres":
        return POSTGRES_SERVER
    if name.startswith("python"):
        if argv[1:2] == ["-c"]:
            return f"{name} -c"
        if "-m" in argv[1:-1]:
            return argv[argv.index("-m") + 1]
        scripts = [arg for arg in argv[1:] if not arg.startswith("-")]
        return Path(scripts[0]).name if scripts else name
    return name


def other_cpu(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], *, skip: set[int]
) -> dict[str, float]:
    """CPU seconds since `before` of the processes alive at `after` by label, busiest first."""
    by_label: dict[str, float] = {}
    for pid, (label, cpu_s) in after.items():
        if pid not in skip:
            spent = cpu_s - before.get(pid, (label, 0.0))[1]
            by_label[label] = by_label.get(label, 0.0) + spent
    return dict(sorted(by_label.items(), key=lambda item: -item[1]))


def read_machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text(encoding="ascii").split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """Every CPU counter the report compares, taken at one moment."""

    gateway: ProcessSample
    bench_s: float
    machine: tuple[int, int]
    processes: dict[int, tuple[str, float]]

    @classmethod
    def take(cls, gateway: GatewayProcess, database: str) -> CpuSnapshot:
        """The counters now."""
        return cls(
            gateway=gateway.sample(),
            bench_s=time.process_time(),
            machine=read_machine_ticks(),
            processes=cpu_by_process(database),
        )


def cpu_report(
    start: CpuSnapshot, end: CpuSnapshot, *, wall: float, gateway_pid: int
) -> dict[str, Any]:
    """CPU use between two snapshots, each process in % of one core."""
    gateway_s = None
    if start.gateway.cpu_s is not None and end.gateway.cpu_s is not None:
        gateway_s = end.gateway.cpu_s - start.gateway.cpu_s
    busy = end.machine[0] - start.machine[0]
    ticks = end.machine[1] - start.machine[1]
    machine_pct = 100 * busy / ticks * (os.cpu_count() or 1) if ticks else 0.0
    gateway_pct = None if gateway_s is None else round(100 * gateway_s / wall, 1)
    bench_pct = round(100 * (end.bench_s - start.bench_s) / wall, 1)
    others = other_cpu(start.processes, end.processes, skip={os.getpid(), gateway_pid})
    others_pct = {label: 100 * cpu_s / wall for label, cpu_s in others.items()}
    return {
        "machine_busy_pct": round(machine_pct, 1),
        "gateway_pct": gateway_pct,
        "bench_pct": bench_pct,
        "others_pct": {label: round(pct, 1) for label, pct in others_pct.items() if pct >= 1.0},
        # Processes that started and ended between the snapshots (other people's test runs,
        # for one; PostgreSQL's ended backends are in the server's figure) and the kernel's.
        "unattributed_pct": round(
            machine_pct - (gateway_pct or 0.0) - bench_pct - sum(others_pct.values()), 1
        ),
    }
