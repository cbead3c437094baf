"""Web-channel ingestion on PostgreSQL with the offline LLM: acceptance rate, ack latency and
end-to-end completion.

What it measures, on a gateway started as its own process against a throwaway database:

- `accepted_per_s`: HTTP 202 answers of `POST /web/v1/messages` per second under load, either
  closed loop (`--concurrency` POSTs in flight) or open loop (`--rate` messages per second);
- `ack_ms`: time from sending the POST to receiving its 202 (p50/p90/p99/max); in open-loop
  mode it counts from the moment the message was due, so a gateway that falls behind cannot
  hide its queue (coordinated omission);
- `completion_s` and `replies_per_s`: from the first POST until every accepted message has a
  reply in `GET /web/v1/messages?user=U&after=CURSOR`. The feed is read once the sending stops
  (reading it during the load would take CPU from the gateway being measured);
  `replies_committed_at_load_end` (from `/metrics`) shows how far behind the pipeline was;
- correctness, over every accepted message (warm-up included), from a final full read of each
  user's feed: `lost` (no reply), `duplicates` (extra replies), `misrouted` (a reply in another
  user's feed), `unexpected_replies` (replies to no message of this run) and
  `skipped_by_cursor` (replies the incremental cursor never returned);
- the gateway's CPU time and peak RSS (from /proc), and how busy the whole machine was, since
  the load generator, PostgreSQL and the gateway share its cores.

Run it (PostgreSQL on 127.0.0.1:5432, trust auth; it creates and drops `gateway_bench_*`):

    .venv/bin/python bench/routing.py --messages 5000 --users 100
    .venv/bin/python bench/routing.py --messages 2000 --rate 500
    .venv/bin/python bench/routing.py --messages 2000 --profile /tmp/gateway.prof

One JSON object goes to stdout, progress to stderr. The exit code is 1 when a message was lost
or answered twice, 2 when the benchmark could not run.
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
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import yaml
from psycopg import sql

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
FEED_PAGE = 500  # the largest `limit` the feed accepts
GOAL_ACCEPTED_PER_S = 500.0
GOAL_ACK_P99_MS = 50.0


class BenchError(Exception):
    """The benchmark could not run (database, gateway start-up); the message says why."""


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


@dataclass(frozen=True, slots=True)
class Ack:
    """The answer to one POST."""

    message_id: str
    user: str
    accepted: bool
    duplicate: bool
    latency_s: float
    send_lag_s: float
    error: str | None


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """CPU and memory figures of one process, read from /proc."""

    cpu_s: float | None
    peak_rss_mb: float | None


# --- the throwaway database and the gateway process ---------------------------------------


@contextlib.contextmanager
def throwaway_database(admin_url: str, *, keep: bool) -> Iterator[str]:
    """Create `gateway_bench_<random>` and drop it afterwards (also on errors and Ctrl-C)."""
    name = f"gateway_bench_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise BenchError(f"cannot create the database with {admin_url}: {exc}") from exc
    try:
        yield name
    finally:
        if keep:
            progress(f"kept database {name}")
        else:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
            progress(f"dropped database {name}")


def gateway_database_url(admin_url: str, database: str) -> str:
    """The admin URL pointed at `database`, with the async driver the gateway uses."""
    parts = urlsplit(admin_url)
    return urlunsplit(parts._replace(scheme="postgresql+psycopg", path=f"/{database}"))


def user_ids(count: int) -> list[str]:
    """`u0001`, `u0002`, … (wider when there are more users)."""
    width = max(4, len(str(count)))
    return [f"u{number:0{width}d}" for number in range(1, count + 1)]


def write_config(folder: Path, *, port: int, database_url: str, users: Sequence[str]) -> Path:
    """A gateway config: PostgreSQL, local transcripts, offline LLM, the open web channel."""
    config = {
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
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def read_process(pid: int) -> ProcessSample:
    """User+system CPU seconds (/proc/PID/stat) and peak RSS (VmHWM) of a live process."""
    cpu_s = peak_rss_mb = None
    with contextlib.suppress(OSError, IndexError, ValueError):
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
        fields = stat.rsplit(")", 1)[1].split()  # the name may contain spaces and brackets
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    with contextlib.suppress(OSError, IndexError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                peak_rss_mb = int(line.split()[1]) / 1024
    return ProcessSample(cpu_s=cpu_s, peak_rss_mb=peak_rss_mb)


def read_machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text(encoding="ascii").split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


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
        """Start the gateway and wait until `/healthz` answers."""
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
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(
                    f"the gateway exited with {self.process.returncode}\n{self.tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/healthz", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise BenchError(f"the gateway did not answer /healthz within {timeout}s\n{self.tail()}")

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
            progress("the gateway ignored SIGTERM; killing it")
            self.process.kill()
            self.process.wait()
            return None

    def tail(self, lines: int = 20) -> str:
        """The last lines of the gateway's stderr."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


# --- load ---------------------------------------------------------------------------------


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
        return Ack(
            message_id, user, False, False, latency, sent - origin, str(response.status_code)
        )
    answer = response.json()
    duplicate = bool(answer.get("duplicate")) or answer.get("message_id") != message_id
    return Ack(message_id, user, True, duplicate, latency, sent - origin, None)


async def send_closed_loop(
    client: httpx.AsyncClient, plan: Sequence[tuple[str, str]], concurrency: int
) -> list[Ack]:
    """Keep `concurrency` POSTs in flight until the plan is sent."""
    pending = iter(plan)
    acks: list[Ack] = []

    async def worker() -> None:
        for user, message_id in pending:  # shared iterator: each item goes to one worker
            acks.append(await post_message(client, user, message_id))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return acks


async def send_open_loop(
    client: httpx.AsyncClient, plan: Sequence[tuple[str, str]], rate: float
) -> list[Ack]:
    """Start one POST every 1/rate seconds, whether or not earlier ones were answered."""
    start = time.perf_counter()
    tasks: list[asyncio.Task[Ack]] = []
    for index, (user, message_id) in enumerate(plan):
        due = start + index / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(post_message(client, user, message_id, due=due)))
    return list(await asyncio.gather(*tasks))


# --- replies ------------------------------------------------------------------------------


@dataclass
class FeedReader:
    """Follows each user's reply feed with its cursor, noting when each reply was first seen."""

    client: httpx.AsyncClient
    cursors: dict[str, str] = field(default_factory=dict)
    seen_at: dict[str, float] = field(default_factory=dict)  # in_reply_to → perf_counter

    async def read_user(self, user: str) -> None:
        """Read the user's feed from the cursor to its end."""
        while True:
            messages, cursor = await read_feed_page(self.client, user, self.cursors.get(user, ""))
            arrived = time.perf_counter()
            self.cursors[user] = cursor
            for message in messages:
                key = message.get("in_reply_to")
                if isinstance(key, str):
                    self.seen_at.setdefault(key, arrived)
            if len(messages) < FEED_PAGE:
                return

    async def wait_for(
        self, expected: dict[str, set[str]], *, deadline: float, label: str
    ) -> float | None:
        """Read the feeds of users still missing replies until none is; when the last arrived.

        None when the deadline passed first. Only users with missing replies are read, and
        passes are spaced out, so the reading takes little from the gateway it waits for.
        """
        slots = asyncio.Semaphore(8)
        total = sum(len(ids) for ids in expected.values())
        reported = time.monotonic()

        async def read(user: str) -> None:
            async with slots:
                await self.read_user(user)

        while True:
            waiting = [u for u, ids in expected.items() if any(i not in self.seen_at for i in ids)]
            if not waiting:
                return max(
                    (self.seen_at[i] for ids in expected.values() for i in ids), default=None
                )
            if time.perf_counter() > deadline:
                return None
            await asyncio.gather(*(read(user) for user in waiting))
            if time.monotonic() - reported > 2.0:
                done = sum(1 for ids in expected.values() for i in ids if i in self.seen_at)
                progress(f"{label}: {done}/{total} replies")
                reported = time.monotonic()
            await asyncio.sleep(0.2)


async def read_feed_page(
    client: httpx.AsyncClient, user: str, after: str
) -> tuple[list[dict[str, Any]], str]:
    """One page of a user's reply feed and the cursor after it."""
    response = await client.get(
        "/web/v1/messages", params={"user": user, "after": after, "limit": str(FEED_PAGE)}
    )
    response.raise_for_status()
    page: dict[str, Any] = response.json()
    return list(page["messages"]), str(page["cursor"])


@dataclass(frozen=True, slots=True)
class Audit:
    """Every accepted message against a full read of every user's feed."""

    replied: frozenset[str]
    lost: int
    duplicates: int
    misrouted: int
    unexpected: int


async def audit_feeds(client: httpx.AsyncClient, sent: dict[str, str]) -> Audit:
    """Read each feed from the start; `sent` maps each accepted message id to its user."""
    replies: Counter[str] = Counter()
    misrouted = unexpected = 0
    for user in sorted(set(sent.values())):
        cursor = ""
        while True:
            messages, cursor = await read_feed_page(client, user, cursor)
            for message in messages:
                key = message.get("in_reply_to")
                if not isinstance(key, str) or key not in sent:
                    unexpected += 1
                elif sent[key] != user:
                    misrouted += 1
                else:
                    replies[key] += 1
            if len(messages) < FEED_PAGE:
                break
    lost = sum(1 for message_id in sent if replies[message_id] == 0)
    duplicates = sum(count - 1 for count in replies.values() if count > 1)
    return Audit(
        replied=frozenset(replies),
        lost=lost,
        duplicates=duplicates,
        misrouted=misrouted,
        unexpected=unexpected,
    )


async def turns_completed(client: httpx.AsyncClient) -> int | None:
    """Turns the gateway has committed a reply for, from its `/metrics`."""
    try:
        response = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    for line in response.text.splitlines():
        if line.startswith("gateway_turn_duration_seconds_count"):
            return int(float(line.split()[-1]))
    return None


# --- the run ------------------------------------------------------------------------------


def percentiles_ms(latencies: Sequence[float]) -> dict[str, float | None]:
    """Nearest-rank p50/p90/p99 and the maximum, in milliseconds."""
    ordered = sorted(latencies)
    if not ordered:
        return {"p50": None, "p90": None, "p99": None, "max": None}

    def rank(q: float) -> float:
        return round(ordered[max(math.ceil(q * len(ordered)) - 1, 0)] * 1000, 2)

    return {"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": rank(1.0)}


def plan_messages(prefix: str, count: int, users: Sequence[str]) -> list[tuple[str, str]]:
    """(user, message id) pairs, round-robin over the users."""
    return [(users[n % len(users)], f"{prefix}-{n:06d}") for n in range(count)]


def expected_by_user(acks: Sequence[Ack]) -> dict[str, set[str]]:
    """The accepted message ids, by user."""
    expected: dict[str, set[str]] = {}
    for ack in acks:
        if ack.accepted and not ack.duplicate:
            expected.setdefault(ack.user, set()).add(ack.message_id)
    return expected


async def run_load(
    settings: BenchSettings, gateway: GatewayProcess, users: Sequence[str]
) -> dict[str, Any]:
    """Warm up, send the measured load, wait for the replies, audit; the figures."""
    run_id = secrets.token_hex(3)
    pool = max(settings.concurrency, 8)
    limits = httpx.Limits(max_connections=pool, max_keepalive_connections=pool)
    timeout = httpx.Timeout(30.0, pool=None)  # waiting for a connection is part of the latency
    async with httpx.AsyncClient(
        base_url=gateway.base_url, limits=limits, timeout=timeout
    ) as client:
        reader = FeedReader(client)
        deadline = time.perf_counter() + settings.timeout

        progress(f"warm-up: {settings.warmup} messages")
        warm = await send_closed_loop(
            client, plan_messages(f"w{run_id}", settings.warmup, users), settings.concurrency
        )
        if (
            await reader.wait_for(expected_by_user(warm), deadline=deadline, label="warm-up")
            is None
        ):
            progress("warm-up replies incomplete at the deadline; measuring anyway")
        turns_before = await turns_completed(client)

        plan = plan_messages(f"m{run_id}", settings.messages, users)
        mode = "closed loop" if settings.rate is None else f"open loop at {settings.rate:g}/s"
        progress(f"load: {settings.messages} messages, {len(users)} users, {mode}")
        gateway_before = gateway.sample()
        machine_before = read_machine_ticks()
        bench_before = time.process_time()
        started = time.perf_counter()
        if settings.rate is None:
            acks = await send_closed_loop(client, plan, settings.concurrency)
        else:
            acks = await send_open_loop(client, plan, settings.rate)
        load_end = time.perf_counter()
        gateway_at_load_end = gateway.sample()
        machine_at_load_end = read_machine_ticks()
        bench_at_load_end = time.process_time()
        turns_at_load_end = await turns_completed(client)

        accepted = [ack for ack in acks if ack.accepted]
        expected = expected_by_user(acks)
        progress(f"load done in {load_end - started:.2f}s; waiting for the replies")
        deadline = time.perf_counter() + settings.timeout
        last_reply = await reader.wait_for(expected, deadline=deadline, label="replies")
        gateway_at_completion = gateway.sample()

        await asyncio.sleep(1.0)  # a surplus reply committed just after the last one shows now
        sent = {ack.message_id: ack.user for ack in [*warm, *acks] if ack.accepted}
        for user in users:  # the cursors' last word, to compare with the full read below
            await reader.read_user(user)
        audit = await audit_feeds(client, sent)

    load_s = load_end - started
    completion_s = None if last_reply is None else last_reply - started
    replied = sum(1 for ids in expected.values() for i in ids if i in reader.seen_at)
    busy = machine_at_load_end[0] - machine_before[0]
    ticks = machine_at_load_end[1] - machine_before[1]
    ack_ms = percentiles_ms([ack.latency_s for ack in accepted])
    accepted_per_s = len(accepted) / load_s if load_s > 0 else 0.0
    errors = Counter(ack.error for ack in acks if ack.error is not None)
    return {
        "settings": {
            "messages": settings.messages,
            "users": len(users),
            "mode": "closed" if settings.rate is None else "open",
            "concurrency": settings.concurrency,
            "rate": settings.rate,
            "warmup": settings.warmup,
            "profiled": settings.profile is not None,
        },
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "accepted": len(accepted),
        "load_s": round(load_s, 3),
        "accepted_per_s": round(accepted_per_s, 1),
        "ack_ms": ack_ms,
        "ack_measured_from": "send" if settings.rate is None else "schedule",
        "send_lag_ms_max": round(max((a.send_lag_s for a in acks), default=0.0) * 1000, 2),
        "replies_committed_at_load_end": (
            None
            if turns_before is None or turns_at_load_end is None
            else turns_at_load_end - turns_before
        ),
        "replied": replied,
        "completion_s": None if completion_s is None else round(completion_s, 3),
        "replies_per_s": (None if not completion_s else round(replied / completion_s, 1)),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "acked_as_duplicate": sum(1 for ack in accepted if ack.duplicate),
        "lost": audit.lost,
        "duplicates": audit.duplicates,
        "misrouted": audit.misrouted,
        "unexpected_replies": audit.unexpected,
        "skipped_by_cursor": len(audit.replied - reader.seen_at.keys()),
        "gateway_cpu_s": _cpu_delta(gateway_before, gateway_at_completion),
        "gateway_cpu_pct_of_core_during_load": _percent(
            _cpu_delta(gateway_before, gateway_at_load_end), load_s
        ),
        "bench_cpu_pct_of_core_during_load": _percent(bench_at_load_end - bench_before, load_s),
        "machine_cpu_busy_pct_during_load": round(100 * busy / ticks, 1) if ticks else None,
        "goals": {
            "accepted_per_s": GOAL_ACCEPTED_PER_S,
            "ack_p99_ms": GOAL_ACK_P99_MS,
            "met": accepted_per_s >= GOAL_ACCEPTED_PER_S
            and ack_ms["p99"] is not None
            and ack_ms["p99"] <= GOAL_ACK_P99_MS,
        },
    }


def _cpu_delta(before: ProcessSample, after: ProcessSample) -> float | None:
    if before.cpu_s is None or after.cpu_s is None:
        return None
    return round(after.cpu_s - before.cpu_s, 2)


def _percent(cpu_s: float | None, wall_s: float) -> float | None:
    return None if cpu_s is None or wall_s <= 0 else round(100 * cpu_s / wall_s, 1)


def progress(text: str) -> None:
    """One line of progress on stderr."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


def parse_settings(argv: Sequence[str] | None) -> BenchSettings:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=5000, help="measured messages (5000)")
    parser.add_argument("--users", type=int, default=100, help="users, round-robin (100)")
    parser.add_argument("--concurrency", type=int, default=64, help="POSTs in flight (64)")
    parser.add_argument("--rate", type=float, help="open loop: messages per second")
    parser.add_argument("--warmup", type=int, default=300, help="uncounted messages first (300)")
    parser.add_argument("--timeout", type=float, default=300.0, help="wait for replies (300s)")
    parser.add_argument("--database-url", default=DEFAULT_ADMIN_URL, help="admin database URL")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--profile", type=Path, help="run the gateway under cProfile, to FILE")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.users < 1 or args.concurrency < 1 or args.warmup < 0:
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
    )


def _stop_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the gateway is stopped, the database dropped


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    settings = parse_settings(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
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
                database_url=gateway_database_url(settings.admin_url, database),
                users=users,
            )
            progress(f"starting the gateway on port {port} (database {database})")
            gateway = GatewayProcess.start(
                config, port=port, workdir=workdir, profile=settings.profile
            )
            try:
                result = asyncio.run(run_load(settings, gateway, users))
            finally:
                exit_code = gateway.stop()
                if exit_code != 0:
                    progress(f"gateway exit code {exit_code}\n{gateway.tail()}")
    except BenchError as exc:
        progress(str(exc))
        return 2
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    result["gateway_peak_rss_mb"] = (
        None if gateway.final.peak_rss_mb is None else round(gateway.final.peak_rss_mb, 1)
    )
    result["gateway_cpu_s_total"] = gateway.final.cpu_s
    result["gateway_exit_code"] = exit_code
    print(json.dumps(result, indent=2))
    return 1 if result["lost"] or result["duplicates"] or result["misrouted"] else 0


if __name__ == "__main__":
    sys.exit(main())
