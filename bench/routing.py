"""Web-channel ingestion on PostgreSQL with the offline LLM: acceptance rate, ack latency and
end-to-end completion.

What it measures, on a gateway started as its own process against a throwaway database:

- `accepted_per_s`: HTTP 202 answers of `POST /web/v1/messages` per second under load, either
  closed loop (`--concurrency` POSTs in flight) or open loop (`--rate` messages per second,
  at most `--concurrency` in flight);
- `ack_ms`: time from sending the POST to receiving its 202 (p50/p90/p99/max). In open-loop
  mode it counts from the moment the message was due, so a gateway that falls behind cannot
  hide its queue (coordinated omission); `send_delay_ms_max` is the longest a due message
  waited for the generator or a free connection;
- `completion_s` and `replies_per_s`: from the first POST until every accepted message has a
  reply in `GET /web/v1/messages?user=U&after=CURSOR`. The feeds are read once the sending
  stops, and sparingly (see `FeedFollower.wait_for`), since reading them takes CPU from the
  gateway being measured; `replies_committed_at_load_end` (turns finished by then, from
  `/metrics`) shows how far behind the replies were;
- correctness, over every accepted message (warm-up included), from a final full read of each
  user's feed: `lost` (no reply before `--timeout`), `duplicates` (extra replies), `misrouted`
  (a reply in another user's feed), `unexpected_replies` (replies to nothing sent here),
  `replied_after_error` (replies to POSTs that failed: stored, but not acknowledged) and
  `skipped_by_cursor` (replies the incremental cursor never returned);
- CPU during the load, in % of one core: the machine's, the gateway's (/proc/PID/stat), this
  program's and the other processes' (PostgreSQL, anything else running), since they all
  share the cores, and what could not be attributed; the gateway's peak RSS (VmHWM);
- `database_work_per_message`: PostgreSQL's statistics for the benchmark's database (sessions
  opened, commits, rows fetched, time spent executing statements, and scans and rows read and
  written by table) from the start of the load until the gateway stopped, divided by the
  accepted messages.

Run it (PostgreSQL on 127.0.0.1:5432, trust auth; it creates and drops `gateway_bench_*`):

    .venv/bin/python bench/routing.py --messages 5000 --users 100
    .venv/bin/python bench/routing.py --messages 2000 --rate 500
    .venv/bin/python bench/routing.py --messages 2000 --profile /tmp/gateway.prof
    .venv/bin/python bench/routing.py --messages 2000 --set storage.pool_size=40

One JSON object goes to stdout, progress to stderr. The exit code is 1 when a message was lost,
answered twice or answered to the wrong user, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import yaml
from benchkit import BenchError, progress, throwaway_database

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
FEED_PAGE = 500  # the largest `limit` the feed accepts
FEED_READERS = 8  # feeds read at once while waiting for replies
GOAL_ACCEPTED_PER_S = 500.0
GOAL_ACK_P99_MS = 50.0


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """The command line, validated."""

    messages: int
    users: int
    concurrency: int
    rate: float | None
    warmup: int
    timeout: float
    admin_url: str
    keep: bool
    profile: Path | None
    overrides: tuple[tuple[str, object], ...]  # (dotted config key, value) from --set


@dataclass(frozen=True, slots=True)
class Ack:
    """The answer to one POST (`error` is the status code or exception when it was no 202)."""

    message_id: str
    user: str
    accepted: bool
    duplicate: bool
    latency_s: float
    send_delay_s: float
    error: str | None


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """CPU seconds and peak RSS of one process, read from /proc (None when unreadable).

    `ended_children_cpu_s` is the CPU of its children that ended and were waited for.
    """

    cpu_s: float | None
    peak_rss_mb: float | None
    ended_children_cpu_s: float = 0.0


# --- the throwaway database and the gateway process ---------------------------------------


DATABASE_QUERY = """
    SELECT sessions, xact_commit, xact_rollback, tup_fetched, active_time
    FROM pg_stat_database WHERE datname = current_database()
"""
TABLES_QUERY = """
    SELECT relname, seq_scan + coalesce(idx_scan, 0),
           seq_tup_read + coalesce(idx_tup_fetch, 0), n_tup_ins + n_tup_upd + n_tup_del
    FROM pg_stat_user_tables
"""


def read_database_counters(url: str) -> dict[str, float]:
    """PostgreSQL's cumulative statistics of the database at `url`, flattened.

    Backends report their statistics with a delay (up to 10 s when idle), but always when
    their connection ends: the figures are complete only once the gateway closed its pool.
    """
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(DATABASE_QUERY).fetchone() or (0, 0, 0, 0, 0)
        tables = connection.execute(TABLES_QUERY).fetchall()
    names = ("sessions_opened", "commits", "rollbacks", "rows_fetched", "active_ms")
    counters = {name: float(value) for name, value in zip(names, row, strict=True)}
    for table, scans, rows_read, rows_written in tables:
        counters[f"{table}.scans"] = float(scans)
        counters[f"{table}.rows_read"] = float(rows_read)
        counters[f"{table}.rows_written"] = float(rows_written)
    return counters


def database_work(
    before: dict[str, float], after: dict[str, float], *, messages: int
) -> dict[str, Any]:
    """The database's work between two readings, per message; the busiest tables by scans."""
    per_message = {
        name: round((value - before.get(name, 0.0)) / messages, 2) for name, value in after.items()
    }
    work: dict[str, Any] = {name: value for name, value in per_message.items() if "." not in name}
    tables: dict[str, dict[str, float]] = {}
    for name, value in per_message.items():
        if "." in name:
            table, counter = name.split(".", 1)
            tables.setdefault(table, {})[counter] = value
    busiest = sorted(tables.items(), key=lambda item: -item[1].get("scans", 0.0))
    work["tables"] = {table: counters for table, counters in busiest if counters["scans"] >= 0.1}
    return work


def database_url(admin_url: str, database: str, *, driver: str = "") -> str:
    """The admin URL pointed at `database` (with `+driver` for SQLAlchemy)."""
    parts = urlsplit(admin_url)
    scheme = f"postgresql+{driver}" if driver else "postgresql"
    return urlunsplit(parts._replace(scheme=scheme, path=f"/{database}"))


def user_ids(count: int) -> list[str]:
    """`u0001`, `u0002`, … (wider when there are more users)."""
    width = max(4, len(str(count)))
    return [f"u{number:0{width}d}" for number in range(1, count + 1)]


def write_config(
    folder: Path,
    *,
    port: int,
    database_url: str,
    users: Sequence[str],
    overrides: Sequence[tuple[str, object]] = (),
) -> Path:
    """A gateway config: PostgreSQL, local transcripts, offline LLM, the open web channel."""
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port},
        "logging": {"level": "warning"},
        "storage": {
            "database_url": database_url,
            "transcripts": {"backend": "local", "local_path": str(folder / "transcripts")},
        },
        "organizations": [{"id": "acme", "name": "Acme"}],
        "identity": {"users": [{"id": user, "org": "acme"} for user in users]},
        "channels": {"web": {"enabled": True, "dev_open": True}},
    }
    for key, value in overrides:
        *parents, leaf = key.split(".")
        section = config
        for name in parents:
            section = section.setdefault(name, {})
        section[leaf] = value
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class GatewayProcess:
    """`python -m gateway run` in a temporary folder, stopped with SIGTERM."""

    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    final: ProcessSample = field(default_factory=lambda: ProcessSample(None, None))

    @classmethod
    def start(
        cls, config: Path, *, port: int, workdir: Path, profile: Path | None
    ) -> GatewayProcess:
        """Start the gateway (under cProfile when `profile`) and wait until `/healthz` answers."""
        command = [sys.executable]
        if profile is not None:
            command += ["-m", "cProfile", "-o", str(profile.resolve())]
        command += ["-m", "gateway", "run", "--config", str(config)]
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        log_path = workdir / "gateway.log"
        with log_path.open("wb") as log:
            # A session of its own: the terminal's Ctrl-C reaches the benchmark, which then
            # stops the gateway in order instead of both dying at once.
            process = subprocess.Popen(
                command, cwd=workdir, env=env, stderr=log, start_new_session=True
            )
        gateway = cls(process, f"http://127.0.0.1:{port}", log_path)
        gateway.wait_healthy(timeout=60.0)
        return gateway

    def wait_healthy(self, *, timeout: float) -> None:
        """Poll `/healthz`; raise `BenchError` with the log's tail if the gateway never answers."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.base_url, timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise BenchError(
                        f"the gateway exited with {self.process.returncode}:\n{self.tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/healthz").status_code == 200:
                        return
                time.sleep(0.1)
        raise BenchError(f"the gateway did not answer /healthz within {timeout}s:\n{self.tail()}")

    def sample(self) -> ProcessSample:
        """CPU and peak RSS now."""
        return read_process(self.process.pid)

    def stop(self, *, timeout: float = 30.0) -> int | None:
        """Record the final figures, SIGTERM, wait (then SIGKILL); the exit code."""
        if self.process.poll() is None:
            self.final = self.sample()
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            progress(f"the gateway ignored SIGTERM for {timeout}s; killing it")
            self.process.kill()
            self.process.wait()
            return None

    def log_levels(self) -> dict[str, int]:
        """How many lines the gateway logged, by level (its JSON lines carry `level`)."""
        levels: Counter[str] = Counter()
        for line in self.tail(lines=None).splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                entry = None
            level = entry.get("level") if isinstance(entry, dict) else None
            levels[str(level) if level else "unparsed"] += 1
        return dict(levels)

    def tail(self, lines: int | None = 20) -> str:
        """The last lines of the gateway's stderr (all of it when `lines` is None)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return text if lines is None else "\n".join(text.splitlines()[-lines:])


# --- CPU and memory, from /proc -----------------------------------------------------------


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


# --- HTTP ---------------------------------------------------------------------------------


class Connections:
    """Keep-alive connections to the gateway, each an `httpx.AsyncClient` handed out whole.

    httpx's own pool scans every connection (with a poll() each) whenever a request starts or
    ends: with 64 connections that cost the generator more CPU than the gateway spent. A queue
    of single-connection clients costs nothing per request.
    """

    def __init__(self, base_url: str, size: int, tls: ssl.SSLContext) -> None:
        # Plain HTTP on loopback; a shared context spares each client loading the CA bundle.
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        self._clients = [
            httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30.0, verify=tls)
            for _ in range(size)
        ]
        self._idle: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
        for client in self._clients:
            self._idle.put_nowait(client)

    async def __aenter__(self) -> Connections:
        return self

    async def __aexit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        await asyncio.gather(*(client.aclose() for client in self._clients))

    @property
    def size(self) -> int:
        """How many connections there are."""
        return len(self._clients)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[httpx.AsyncClient]:
        """A connection of its own for the block (waits while all are busy)."""
        client = await self._idle.get()
        try:
            yield client
        finally:
            self._idle.put_nowait(client)


async def post_message(
    client: httpx.AsyncClient, user: str, message_id: str, *, due: float | None = None
) -> Ack:
    """POST one message; latency counts from `due` when given (open loop), else from sending."""
    sent = time.perf_counter()
    origin = sent if due is None else due
    body = {"user": user, "text": f"benchmark message {message_id}", "message_id": message_id}
    try:
        response = await client.post("/web/v1/messages", json=body)
    except httpx.HTTPError as exc:
        latency = time.perf_counter() - origin
        progress(f"POST {message_id} failed after {latency * 1000:.0f} ms: {exc!r}")
        return Ack(message_id, user, False, False, latency, sent - origin, type(exc).__name__)
    latency = time.perf_counter() - origin
    if response.status_code != 202:
        error = f"HTTP {response.status_code}"
        return Ack(message_id, user, False, False, latency, sent - origin, error)
    answer = response.json()
    duplicate = bool(answer.get("duplicate")) or answer.get("message_id") != message_id
    return Ack(message_id, user, True, duplicate, latency, sent - origin, None)


async def send_closed_loop(connections: Connections, plan: Sequence[tuple[str, str]]) -> list[Ack]:
    """One worker per connection, each sending its next message as soon as one is answered."""
    pending = iter(plan)
    acks: list[Ack] = []

    async def worker() -> None:
        async with connections.connection() as client:
            for user, message_id in pending:  # a shared iterator: each item goes to one worker
                acks.append(await post_message(client, user, message_id))

    await asyncio.gather(*(worker() for _ in range(connections.size)))
    return acks


async def send_open_loop(
    connections: Connections, plan: Sequence[tuple[str, str]], rate: float
) -> list[Ack]:
    """Start one POST every 1/rate seconds, whether or not earlier ones were answered."""

    async def send(user: str, message_id: str, due: float) -> Ack:
        async with connections.connection() as client:
            return await post_message(client, user, message_id, due=due)

    start = time.perf_counter()
    tasks: list[asyncio.Task[Ack]] = []
    for index, (user, message_id) in enumerate(plan):
        due = start + index / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(user, message_id, due)))
    return list(await asyncio.gather(*tasks))


async def read_feed_page(
    client: httpx.AsyncClient, user: str, after: str
) -> tuple[list[dict[str, Any]], str]:
    """One page of a user's reply feed and the cursor after it."""
    params = {"user": user, "after": after, "limit": str(FEED_PAGE)}
    for attempt in range(3):
        try:
            response = await client.get("/web/v1/messages", params=params)
            break
        except httpx.TransportError:  # a keep-alive connection closed under the request
            if attempt == 2:
                raise
    response.raise_for_status()
    page: dict[str, Any] = response.json()
    return list(page["messages"]), str(page["cursor"])


async def read_whole_feed(connections: Connections, user: str) -> list[dict[str, Any]]:
    """Every reply a user has, from the feed's start."""
    replies: list[dict[str, Any]] = []
    cursor = ""
    async with connections.connection() as client:
        while True:
            messages, cursor = await read_feed_page(client, user, cursor)
            replies += messages
            if len(messages) < FEED_PAGE:
                return replies


async def turns_completed(connections: Connections) -> int | None:
    """How many turns the gateway has committed a reply for, from its `/metrics`."""
    try:
        async with connections.connection() as client:
            response = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    for line in response.text.splitlines():
        if line.startswith("gateway_turn_duration_seconds_count"):
            return int(float(line.split()[-1]))
    return None


# --- replies ------------------------------------------------------------------------------


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


# --- the run ------------------------------------------------------------------------------


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


def expected_by_user(acks: Sequence[Ack]) -> dict[str, set[str]]:
    """The accepted message ids, by user."""
    expected: dict[str, set[str]] = {}
    for ack in acks:
        if ack.accepted:
            expected.setdefault(ack.user, set()).add(ack.message_id)
    return expected


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


def parse_settings(argv: Sequence[str] | None) -> BenchSettings:
    """The command line."""
    parser = argparse.ArgumentParser(
        description="Web-channel ingestion on PostgreSQL: accepted/s, ack latency, replies."
    )
    parser.add_argument("--messages", type=int, default=5000, help="measured messages (5000)")
    parser.add_argument("--users", type=int, default=100, help="users, round-robin (100)")
    parser.add_argument("--concurrency", type=int, default=64, help="POSTs in flight (64)")
    parser.add_argument("--rate", type=float, help="open loop at this many messages/s")
    parser.add_argument("--warmup", type=int, default=300, help="uncounted messages first (300)")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for the replies (600)"
    )
    parser.add_argument(
        "--database-url", default=DEFAULT_ADMIN_URL, help=f"admin URL ({DEFAULT_ADMIN_URL})"
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--profile", type=Path, help="run the gateway under cProfile into FILE")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a gateway config key, e.g. storage.pool_size=40 (VALUE is YAML)",
    )
    args = parser.parse_args(argv)
    overrides = []
    for item in args.set:
        key, equals, value = item.partition("=")
        if not equals or not key:
            parser.error(f"--set {item}: expected KEY=VALUE")
        overrides.append((key, yaml.safe_load(value)))
    if min(args.messages, args.users, args.concurrency) < 1 or args.warmup < 0:
        parser.error("--messages, --users and --concurrency must be positive, --warmup >= 0")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    return BenchSettings(
        messages=args.messages,
        users=args.users,
        concurrency=args.concurrency,
        rate=args.rate,
        warmup=args.warmup,
        timeout=args.timeout,
        admin_url=args.database_url,
        keep=args.keep,
        profile=args.profile,
        overrides=tuple(overrides),
    )


def _interrupt_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the gateway is stopped, the database dropped


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    settings = parse_settings(argv)
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    users = user_ids(settings.users)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="gateway-bench-") as folder,
            throwaway_database(settings.admin_url, keep=settings.keep) as database,
        ):
            workdir = Path(folder)
            port = free_port()
            config = write_config(
                workdir,
                port=port,
                database_url=database_url(settings.admin_url, database, driver="psycopg"),
                users=users,
                overrides=settings.overrides,
            )
            progress(f"starting the gateway on port {port} (database {database})")
            gateway = GatewayProcess.start(
                config, port=port, workdir=workdir, profile=settings.profile
            )
            try:
                result, counters = asyncio.run(run_load(settings, gateway, users, database))
            finally:
                exit_code = gateway.stop()
                log_levels = gateway.log_levels()
                if exit_code != 0 or {"error", "critical", "unparsed"} & log_levels.keys():
                    progress(f"gateway exit code {exit_code}; its log ends:\n{gateway.tail()}")
            time.sleep(0.5)  # the gateway's backends are still exiting
            after = read_database_counters(database_url(settings.admin_url, database))
            result["database_work_per_message"] = database_work(
                counters, after, messages=max(result["accepted"], 1)
            )
    except BenchError as exc:
        progress(str(exc))
        return 2
    except httpx.HTTPError as exc:
        progress(f"the gateway stopped answering: {exc!r}")
        return 2
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    peak_rss_mb = gateway.final.peak_rss_mb
    result["gateway_peak_rss_mb"] = None if peak_rss_mb is None else round(peak_rss_mb, 1)
    result["gateway_cpu_s_total"] = gateway.final.cpu_s
    result["gateway_exit_code"] = exit_code
    result["gateway_log_lines"] = log_levels
    print(json.dumps(result, indent=2))
    return 1 if result["lost"] or result["duplicates"] or result["misrouted"] else 0


if __name__ == "__main__":
    sys.exit(main())
