"""End-to-end load on the Slack channel: signed DM events in, `chat.postMessage` out.

Everything runs as its own process on loopback: the gateway (`python -m gateway run`, a
throwaway PostgreSQL database, transcripts in S3 on moto in server mode), a fake Slack Web API
(`python -m tests.fakes.slack_api`) and a fake Anthropic Messages API answering after
`--llm-latency` seconds (`python -m tests.fakes.anthropic_api`). This program is the load
generator: it sends signed `message.im` events for `--users` users (round-robin), either in a
closed loop (`--concurrency` messages in flight end to end: a worker sends its next event once
the reply to the previous one was posted) or at a fixed `--rate` (open loop: latencies count
from the moment a message was due, so a gateway that falls behind cannot hide its queue).

Each event carries a unique token in its text; the fake model's answer repeats the user's text,
so each post the fake Slack API receives is matched to its event. Per message:

- `ack_ms`: until the HTTP response of `POST /slack/events`;
- `e2e_ms`: event sent (or due) → `chat.postMessage` received by the fake Slack API (the wall
  clocks of two processes on one machine);
- `overhead_ms`: `e2e_ms` minus the model's configured latency (one model call per turn; the
  topic refresh every few messages runs after the reply was committed).

One JSON object goes to stdout, progress to stderr: `sustained_msgs_per_s` (measured messages
answered ÷ first send → last post), those latencies (p50/p90/p99/max), the gateway's
`cpu_s_per_1000_msgs` (from /proc, load start → last post; split into the event loop's thread
and the others: boto3 runs in worker threads), `gateway_peak_rss_mb` (VmHWM), `memory` (RSS
against the sessions in the database, sampled every second: what a new, then idle, session
costs), `backlog` (messages due minus answered; in open loop `growing` when its slope over the
second half of the schedule exceeds 2 % of the rate), `errors`, `duplicates` (extra posts for
one event) and `lost` (acknowledged, never answered, and not queued in the gateway's inbox or
outbox either: when `--timeout` ends a run before the gateway caught up, what is still queued
durably is reported under `correctness`, not as lost); the database's own single-row
INSERT+COMMIT rate on one connection (`pgbench`, else a psycopg loop, in a database of its own
before and after the load) and the ratio of the gateway's messages/s to it, so that runs on
machines of other speeds, or busy with other work, stay comparable; every process's CPU
during the load and PostgreSQL's work per message.

`--gateways N` runs N gateway processes on the one database, each on a port of its own with the
same config otherwise (the first migrates the database and writes the users; the others start
once it answers). The generator sends the events to them in turn, as a load balancer without
session affinity would, and moves the turn on by one at each pass over the users, so that every
user's messages reach every gateway even when `--users` is a multiple of N. The gateway figures
above are then those of all the processes together: CPU and log lines summed, the RSS in
`memory` summed, `gateway_peak_rss_mb` the largest, `gateway_exit_code` the first that is not 0;
`per_gateway` lists each process's events, CPU, peak RSS, exit code and log lines. The fake
Slack API receives the posts of all of them, so that `lost` and `duplicates` cover the lot.

    .venv/bin/python bench/e2e.py --messages 3000                     # closed loop, 0 ms LLM
    .venv/bin/python bench/e2e.py --messages 1200 --rate 20
    .venv/bin/python bench/e2e.py --users 10000 --llm-latency 2 --rate 20 --messages 1200 \\
        --set sessions.max_concurrent_turns=1000
    .venv/bin/python bench/e2e.py --messages 2000 --profile /tmp/gateway.json
    .venv/bin/python bench/e2e.py --messages 600 --logs /tmp/logs --set logging.level=info
    .venv/bin/python bench/e2e.py --users 200 --messages 600 --warmup 100 --gateways 2

`--profile` attaches py-spy (a dev dependency) to the gateway (the first one) for the run
(warm-up included) and writes speedscope JSON; without py-spy it runs that gateway under
cProfile (about half as fast) and adds its top functions to the JSON. `--logs DIR` copies
every process's log there. Exit code 1 when a message was lost or answered twice, 2 when the
benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import pstats
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import boto3
import httpx
import psycopg
import yaml
from benchkit import BenchError, progress, throwaway_database
from routing import (
    DEFAULT_ADMIN_URL,
    PROJECT_ROOT,
    CpuSnapshot,
    GatewayProcess,
    ProcessSample,
    cpu_by_process,
    cpu_report,
    database_url,
    database_work,
    free_port,
    percentiles_ms,
    read_database_counters,
    read_machine_ticks,
    read_process,
    write_config,
)
from slack_ack import slack_overrides

from tests.fakes.slack_api import direct_message, event_envelope, sign

REGION = "us-east-1"
BUCKET = "gateway-bench-transcripts"
# Fake credentials and no shared AWS files: nothing on this machine can reach real AWS.
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}
AWS_ENV_REMOVED = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
TOKEN = re.compile(r"\b([0-9a-f]{6}n\d{7})\b")
POST_POLL_SECONDS = 0.02  # how often the fake Slack API's new posts are read
SAMPLE_SECONDS = 1.0  # backlog and RSS samples
KEEP_ALIVE_SECONDS = 4.0  # uvicorn closes idle connections after 5 s: reconnect before that
GOAL_MSGS_PER_S = 1000.0
GOAL_ACK_P99_MS = 25.0
GOAL_OVERHEAD_P99_MS = 50.0


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """The command line, validated."""

    users: int
    gateways: int
    rate: float | None
    concurrency: int
    messages: int
    llm_latency: float
    warmup: int
    timeout: float
    admin_url: str
    keep: bool
    profile: Path | None
    logs: Path | None
    db_probe_seconds: float
    overrides: tuple[tuple[str, object], ...]


@dataclass(slots=True)
class Sent:
    """One event: when it was due (wall clock), its acknowledgement, or what went wrong."""

    index: int  # numbers every event of the run, warm-up first
    token: str
    user: int
    due_at: float = 0.0
    ack_s: float | None = None
    error: str | None = None


# --- helper processes ---------------------------------------------------------------------


@dataclass
class Service:
    """A helper server run as a process of its own, its output in a log file."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def tail(self, lines: int = 15) -> str:
        """The end of its log."""
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def run_service(
    name: str, command: Sequence[str], *, port: int, workdir: Path
) -> Iterator[Service]:
    """Start `command`, wait until its port answers HTTP, SIGTERM it at the end."""
    log_path = workdir / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=env, stdout=log, stderr=log, start_new_session=True
        )
    service = Service(name, process, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{service.url}/", timeout=1)  # any answer: the server is up
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"{name} did not start:\n{service.tail()}")
            time.sleep(0.1)
        yield service
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def gateway_names(count: int) -> list[str]:
    """What the gateways' logs and folders are called: `gateway` alone, else `gateway-1`…"""
    return ["gateway"] if count == 1 else [f"gateway-{number}" for number in range(1, count + 1)]


def launch_gateway(
    config: Path, *, name: str, port: int, workdir: Path, profile: Path | None
) -> GatewayProcess:
    """`python -m gateway run` (under cProfile when `profile`) in the config's folder, its
    stdout and stderr in `workdir/NAME.log`; not waited for."""
    command = [sys.executable]
    if profile is not None:
        command += ["-m", "cProfile", "-o", str(profile.resolve())]
    command += ["-m", "gateway", "run", "--config", str(config)]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        # stdout too: this program's stdout carries its JSON and nothing else.
        process = subprocess.Popen(
            command, cwd=config.parent, env=env, stdout=log, stderr=log, start_new_session=True
        )
    return GatewayProcess(process, f"http://127.0.0.1:{port}", log_path)


def start_gateways(
    configs: Sequence[tuple[str, int, Path]],
    started: list[GatewayProcess],
    *,
    workdir: Path,
    profile: Path | None,
    timeout: float,
) -> tuple[float, list[float]]:
    """Start a gateway per (name, port, config) and wait until each answers `/healthz`, with a
    longer wait than `GatewayProcess.start` (the start-up writes every configured user and
    identity: a minute or more for 10,000 users). The first starts alone: it migrates the
    database, which two processes must not do at once; the others start together once it
    answers. Each one is added to `started` as it is launched, for the caller to stop (also
    when one fails to start). The seconds until all answered, and each one's from its launch."""
    began = time.perf_counter()
    start_s = []
    for batch in (configs[:1], configs[1:]):
        launched = []
        for name, port, config in batch:
            gateway = launch_gateway(
                config, name=name, port=port, workdir=workdir, profile=None if started else profile
            )
            started.append(gateway)
            launched.append((gateway, time.perf_counter()))
        for gateway, launched_at in launched:
            gateway.wait_healthy(timeout=timeout)
            start_s.append(time.perf_counter() - launched_at)
    return time.perf_counter() - began, start_s


def write_gateway_configs(
    workdir: Path, *, count: int, database_url: str, overrides: Sequence[tuple[str, object]]
) -> list[tuple[str, int, Path]]:
    """The gateways' configs, the same but for the port, each in its own folder (`workdir`
    itself for a single gateway) that is also its working directory: (name, port, config)."""
    configs: list[tuple[str, int, Path]] = []
    for name in gateway_names(count):
        port = free_port()
        while port in {taken for _, taken, _ in configs}:
            port = free_port()
        folder = workdir if count == 1 else workdir / name
        folder.mkdir(exist_ok=True)
        config = write_config(
            folder, port=port, database_url=database_url, users=[], overrides=overrides
        )
        configs.append((name, port, config))
    return configs


def stop_gateways(gateways: Sequence[GatewayProcess]) -> list[int | None]:
    """Stop every gateway at once (`GatewayProcess.stop`: final figures, SIGTERM, wait); their
    exit codes."""
    if not gateways:
        return []
    with ThreadPoolExecutor(max_workers=len(gateways)) as pool:
        return list(pool.map(lambda gateway: gateway.stop(), gateways))


def first_failure(exit_codes: Sequence[int | None]) -> int | None:
    """The first exit code that is not 0 (None: killed after ignoring SIGTERM), else 0."""
    return next((code for code in exit_codes if code != 0), 0)


def use_fake_aws_credentials() -> None:
    """This process and its children (moto, the gateway) get fake AWS credentials only."""
    for name in AWS_ENV_REMOVED:
        os.environ.pop(name, None)
    os.environ.update(FAKE_AWS_ENV)


def create_bucket(endpoint_url: str) -> None:
    """The transcripts' bucket, before the gateway checks it at start-up."""
    client = boto3.client("s3", endpoint_url=endpoint_url, region_name=REGION)
    try:
        client.create_bucket(Bucket=BUCKET)
    finally:
        client.close()


def gateway_overrides(
    settings: BenchSettings, *, slack_url: str, anthropic_url: str, s3_url: str
) -> list[tuple[str, object]]:
    """A Slack-only gateway on the fake APIs, transcripts in S3; then the `--set` overrides."""
    return [
        *slack_overrides(slack_url, settings.users),
        (
            "llm",
            {
                "provider": "anthropic",
                "api_key": "bench-not-a-key",
                "base_url": anthropic_url,
                "max_retries": 2,
            },
        ),
        (
            "storage.transcripts",
            {"backend": "s3", "s3": {"bucket": BUCKET, "endpoint_url": s3_url, "region": REGION}},
        ),
        *settings.overrides,
    ]


# --- the database's own pace --------------------------------------------------------------

PROBE_TABLE = "bench_insert_probe"


def database_insert_rate(url: str, seconds: float) -> tuple[float, str]:
    """Single-row INSERT+COMMIT per second on one connection, and how it was measured.

    `url` is a database of its own on the same server: the probe's commits must not count in
    the gateway database's statistics.
    """
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {PROBE_TABLE} "
            "(id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), note text)"
        )
    pgbench = shutil.which("pgbench")
    if pgbench is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".sql", encoding="utf-8") as script:
            script.write(f"INSERT INTO {PROBE_TABLE} (note) VALUES ('probe');\n")
            script.flush()
            command = [pgbench, "-n", "-c", "1", "-T", str(max(round(seconds), 1))]
            done = subprocess.run(
                [*command, "-f", script.name, url], capture_output=True, text=True, check=False
            )
        found = re.search(r"tps = ([\d.]+)", done.stdout)
        if done.returncode == 0 and found:
            return float(found.group(1)), "pgbench -c 1, one INSERT per transaction"
        progress(f"pgbench failed ({done.returncode}): {done.stderr.strip()[:300]}")
    count = 0
    with psycopg.connect(url) as connection:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            connection.execute(f"INSERT INTO {PROBE_TABLE} (note) VALUES ('probe')")
            connection.commit()
            count += 1
        elapsed = time.perf_counter() - started
    return count / elapsed, "psycopg, one connection, INSERT then COMMIT"


UNANSWERED_QUERY = """
    SELECT wanted.message_id, coalesce(i.status, 'none'), coalesce(o.status, 'none')
    FROM unnest(%s::text[]) AS wanted(message_id)
    LEFT JOIN inbound_events i ON i.channel_type = 'slack' AND i.message_id = wanted.message_id
    LEFT JOIN outbound_messages o ON o.inbound_event_id = i.id
"""


def event_states(url: str, tokens: Sequence[str]) -> dict[str, str]:
    """Where these events are in the gateway's database, by token: `inbox/outbox` status
    (`none/none`: the inbox never stored the event)."""
    if not tokens:
        return {}
    with psycopg.connect(url) as connection:
        rows = connection.execute(UNANSWERED_QUERY, ([f"Ev{token}" for token in tokens],))
        return {
            message_id.removeprefix("Ev"): f"{inbox}/{outbox}" for message_id, inbox, outbox in rows
        }


def is_queued(state: str) -> bool:
    """Waiting durably: pending in the inbox, or its reply pending (or being sent) in the outbox."""
    return state.startswith("pending/") or state.endswith(("/pending", "/sending"))


def count_sessions(url: str) -> int | None:
    """How many sessions the gateway created."""
    with contextlib.suppress(psycopg.Error), psycopg.connect(url) as connection:
        row = connection.execute("SELECT count(*) FROM sessions").fetchone()
        return int(row[0]) if row else None
    return None


# --- the load generator -------------------------------------------------------------------


class EventConnection:
    """One keep-alive HTTP/1.1 connection that POSTs signed events to `/slack/events`.

    A bare asyncio stream rather than httpx: the generator shares two cores with the gateway,
    and httpx costs several times more CPU per request than the few bytes written here.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._used = 0.0

    async def post(self, body: bytes, headers: Mapping[str, str]) -> int:
        """Send one request; the response's status code. Raises `OSError` and the like."""
        if self._writer is None or time.monotonic() - self._used > KEEP_ALIVE_SECONDS:
            await self.close()
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        lines = [
            "POST /slack/events HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
            status, head = await read_response(reader)
        except BaseException:
            await self.close()
            raise
        if "\r\nconnection: close" in head:
            await self.close()
        self._used = time.monotonic()
        return status

    async def close(self) -> None:
        """Close the connection (the next `post` opens another)."""
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, str]:
    """The status and the lower-cased head of one HTTP/1.1 response; its body is skipped."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
    length = re.search(r"\r\ncontent-length: *(\d+)", head)
    if length is None:
        raise ValueError("a response without Content-Length")
    await reader.readexactly(int(length.group(1)))
    return int(head[9:12]), head


Lane = tuple[EventConnection, ...]
"""One connection to each gateway, by the gateway's number."""


class ConnectionPool:
    """Lanes handed out whole (waits while all are busy): whoever holds one can send to any
    gateway."""

    def __init__(self, host: str, ports: Sequence[int], size: int) -> None:
        self._all: list[Lane] = [
            tuple(EventConnection(host, port) for port in ports) for _ in range(size)
        ]
        self._idle: asyncio.Queue[Lane] = asyncio.Queue()
        for lane in self._all:
            self._idle.put_nowait(lane)

    @property
    def size(self) -> int:
        """How many lanes there are."""
        return len(self._all)

    @contextlib.asynccontextmanager
    async def lane(self) -> AsyncIterator[Lane]:
        """A lane of its own for the block."""
        lane = await self._idle.get()
        try:
            yield lane
        finally:
            self._idle.put_nowait(lane)

    async def close(self) -> None:
        """Close every connection."""
        await asyncio.gather(*(connection.close() for lane in self._all for connection in lane))


def signed_event(index: int, user: int, token: str) -> tuple[bytes, dict[str, str]]:
    """A `message.im` event as Slack sends it, and its signature headers."""
    event = direct_message(
        f"bench {token}",
        user=f"U{user:05d}",
        ts=f"{1_800_000_000 + index}.000100",
        channel=f"D{user:05d}",
    )
    body = json.dumps(event_envelope(event, f"Ev{token}")).encode()
    return body, sign(body)


@dataclass
class Progress:
    """What the load has done so far, for the samples."""

    due: int = 0


@dataclass
class LoadGenerator:
    """Builds and sends the events; `index` numbers every event of the run (warm-up first)."""

    pool: ConnectionPool
    posts: PostCollector
    users: int
    gateways: int
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    index: int = 0
    progress: Progress = field(default_factory=Progress)

    def plan(self, count: int) -> list[Sent]:
        """The next `count` events, round-robin over the users (not sent yet)."""
        planned = []
        for _ in range(count):
            token = f"{self.run_id}n{self.index:07d}"
            planned.append(Sent(self.index, token, self.index % self.users))
            self.index += 1
        return planned

    def gateway_for(self, item: Sent) -> int:
        """The gateway that gets this event: the next one in turn, and each user's next one
        at each pass over the users (a plain turn would send a user's every message to one
        gateway when the users are a multiple of the gateways)."""
        return (item.user + item.index // self.users) % self.gateways

    async def send(self, lane: Lane, item: Sent, *, due: float | None) -> None:
        """POST one event; latency from `due` (perf_counter) when given, else from sending."""
        connection = lane[self.gateway_for(item)]
        body, headers = signed_event(item.index, item.user, item.token)
        started = time.perf_counter()
        origin = started if due is None else due
        item.due_at = time.time() - (started - origin)
        try:
            status = await connection.post(body, headers)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            item.error = type(exc).__name__
            return
        item.ack_s = time.perf_counter() - origin
        if status != 200:
            item.error = f"HTTP {status}"

    async def closed_loop(self, items: Sequence[Sent], *, wait_s: float) -> None:
        """`pool.size` workers, each sending its next event once the last one was answered."""
        pending = iter(items)

        async def worker() -> None:
            async with self.pool.lane() as lane:
                for item in pending:  # shared: each item goes to one worker
                    self.progress.due += 1
                    await self.send(lane, item, due=None)
                    if item.error is None:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self.posts.answered(item.token), wait_s)

        await asyncio.gather(*(worker() for _ in range(self.pool.size)))

    async def open_loop(self, items: Sequence[Sent], rate: float) -> None:
        """One event every 1/rate seconds, whether or not earlier ones were answered."""

        async def one(item: Sent, due: float) -> None:
            async with self.pool.lane() as lane:
                await self.send(lane, item, due=due)

        start = time.perf_counter() + 0.05
        tasks = []
        for number, item in enumerate(items):
            due = start + number / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self.progress.due += 1
            tasks.append(asyncio.create_task(one(item, due)))
        await asyncio.gather(*tasks)


class PostCollector:
    """Reads the fake Slack API's posts as they arrive and matches them to events by token."""

    def __init__(self, slack_url: str) -> None:
        self._client = httpx.AsyncClient(base_url=slack_url, timeout=30)
        self.read = 0
        self.at: dict[str, list[float]] = {}  # token → when each post for it arrived
        self.unmatched: list[str] = []
        self._waiters: dict[str, asyncio.Future[None]] = {}

    async def fetch(self) -> None:
        """Read the posts that came since the last call."""
        response = await self._client.get("/_posts", params={"after": str(self.read)})
        response.raise_for_status()
        posts: list[dict[str, Any]] = response.json()
        self.read += len(posts)
        for post in posts:
            tokens = TOKEN.findall(str(post["text"]))
            if not tokens:
                self.unmatched.append(str(post["text"])[:160])
                continue
            token = tokens[-1]  # merged messages: the turn answers the latest
            self.at.setdefault(token, []).append(float(post["at"]))
            waiter = self._waiters.pop(token, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def follow(self) -> None:
        """Fetch until cancelled."""
        while True:
            try:
                await self.fetch()
            except httpx.HTTPError as exc:
                progress(f"reading the fake Slack API's posts failed: {exc!r}")
            await asyncio.sleep(POST_POLL_SECONDS)

    def answered(self, token: str) -> asyncio.Future[None]:
        """Done once a post for `token` arrived."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if token in self.at:
            waiter.set_result(None)
        else:
            self._waiters[token] = waiter
        return waiter

    async def wait_for(self, items: Sequence[Sent], *, deadline: float) -> bool:
        """Wait until every acknowledged event has a post (False: the deadline passed)."""
        reported = time.monotonic()
        while True:
            missing = sum(1 for i in items if i.error is None and i.token not in self.at)
            if not missing:
                return True
            if time.monotonic() > deadline:
                return False
            if time.monotonic() - reported > 10:
                progress(f"waiting for {missing} replies")
                reported = time.monotonic()
            await asyncio.sleep(0.1)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()


# --- samples: backlog and memory ----------------------------------------------------------


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


def turn_workers(parent: int) -> list[int]:
    """The pids of a gateway's turn workers: its children running `gateway run --role turns`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
            if int(stat.rsplit(")", 1)[1].split()[1]) != parent:
                continue
            if b"turns" in (entry / "cmdline").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


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


# --- profiling ----------------------------------------------------------------------------


def py_spy() -> str | None:
    """py-spy, in the project's virtualenv or on the PATH."""
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def profile_top(path: Path, count: int = 15) -> dict[str, list[str]]:
    """The top functions of a cProfile file, by cumulative and by own time, and the own time
    by package (cProfile sees the main thread only, and times wall clock: idle waiting shows
    as `select.epoll.poll`)."""
    entries: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    entries = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]

    def name(key: tuple[str, int, str]) -> str:
        filename, line, function = key
        short = re.sub(r".*/(site-packages|lib/python3\.\d+)/", "", filename)
        short = short.removeprefix(str(PROJECT_ROOT) + "/")
        return f"{short}:{line}({function})"

    def package(key: tuple[str, int, str]) -> str:
        filename, _, function = key
        found = re.search(r"site-packages/([^/]+)", filename)
        if found:
            return found.group(1)
        if filename.startswith(str(PROJECT_ROOT)):
            return filename.removeprefix(str(PROJECT_ROOT) + "/").split("/")[0]
        if filename == "~":
            return function  # a builtin: epoll's poll is the idle loop
        found = re.search(r"lib/python3\.\d+/([^/]+)", filename)
        return f"stdlib {found.group(1).removesuffix('.py')}" if found else filename

    def top(column: int) -> list[str]:
        ranked = sorted(entries.items(), key=lambda item: -item[1][column])[:count]
        return [f"{value[column]:8.2f}s calls={value[1]:<8} {name(key)}" for key, value in ranked]

    by_package: Counter[str] = Counter()
    for key, value in entries.items():
        by_package[package(key)] += value[2]
    total = sum(by_package.values()) or 1.0
    return {
        "by_cumulative": top(3),
        "by_self": top(2),
        "self_by_package": [
            f"{seconds:8.2f}s {100 * seconds / total:5.1f}% {label}"
            for label, seconds in by_package.most_common(count)
        ],
    }


# --- the run ------------------------------------------------------------------------------


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
        "backlog": backlog_summary(samples, load_s=load_s, rate=settings.rate, messages=len(items)),
        "memory": {
            "sessions_in_database": sessions,
            **memory_summary(samples, rss_start=rss_start, rss_end=rss_end),
        },
        "cpu_during_load_pct_of_one_core": cpu_report(
            cpu_start.machine, cpu_end.machine, wall=done_s, gateway_pid=pids[0]
        ),
        "goals": goals(settings, sustained, latencies),
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


def goals(settings: BenchSettings, sustained: float, latencies: dict[str, Any]) -> dict[str, Any]:
    """The issue's goals and whether this run met them."""
    ack_p99 = latencies["ack_ms"]["p99"]
    overhead_p99 = latencies["overhead_ms"]["p99"]
    return {
        "msgs_per_s": GOAL_MSGS_PER_S,
        "ack_p99_ms": GOAL_ACK_P99_MS,
        "overhead_p99_ms": GOAL_OVERHEAD_P99_MS,
        "msgs_per_s_met": sustained >= GOAL_MSGS_PER_S if settings.llm_latency == 0 else None,
        "ack_p99_met": ack_p99 is not None and ack_p99 <= GOAL_ACK_P99_MS,
        "overhead_p99_met": overhead_p99 is not None and overhead_p99 <= GOAL_OVERHEAD_P99_MS,
    }


@contextlib.contextmanager
def py_spy_attached(pid: int, output: Path) -> Iterator[None]:
    """Sample the gateway with py-spy for the duration of the block."""
    command = [str(py_spy()), "record", "--pid", str(pid), "--output", str(output)]
    command += ["--format", "speedscope", "--rate", "100", "--nonblocking"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            _, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
        if process.returncode not in (0, -signal.SIGINT):
            progress(f"py-spy failed: {stderr.decode(errors='replace')[-500:]}")


def run(settings: BenchSettings) -> dict[str, Any]:
    """Start the processes in order, run the load, stop them in reverse order."""
    use_fake_aws_credentials()
    under_py_spy = settings.profile is not None and py_spy() is not None
    if settings.profile is not None and not under_py_spy:
        progress("py-spy is not installed (nor pyinstrument): profiling with cProfile")
    with (
        tempfile.TemporaryDirectory(prefix="gateway-e2e-") as folder,
        throwaway_database(settings.admin_url, keep=settings.keep) as database,
        throwaway_database(settings.admin_url) as probe_database,
    ):
        workdir = Path(folder)
        python = sys.executable
        s3_port, slack_port, anthropic_port = free_port(), free_port(), free_port()
        with (
            run_service(
                "moto",
                [python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
                port=s3_port,
                workdir=workdir,
            ) as s3,
            run_service(
                "fake-slack",
                [python, "-m", "tests.fakes.slack_api", "--port", str(slack_port)],
                port=slack_port,
                workdir=workdir,
            ) as slack,
            run_service(
                "fake-anthropic",
                [
                    *(python, "-m", "tests.fakes.anthropic_api"),
                    *("--port", str(anthropic_port), "--latency", str(settings.llm_latency)),
                ],
                port=anthropic_port,
                workdir=workdir,
            ) as anthropic,
        ):
            create_bucket(s3.url)
            overrides = gateway_overrides(
                settings, slack_url=slack.url, anthropic_url=anthropic.url, s3_url=s3.url
            )
            configs = write_gateway_configs(
                workdir,
                count=settings.gateways,
                database_url=database_url(settings.admin_url, database, driver="psycopg"),
                overrides=overrides,
            )
            ports = ", ".join(str(port) for _, port, _ in configs)
            if settings.gateways == 1:
                progress(f"starting the gateway on port {ports} (database {database})")
            else:
                progress(f"starting {settings.gateways} gateways on ports {ports} ({database})")
            cprofile = settings.profile if settings.profile and not under_py_spy else None
            gateways: list[GatewayProcess] = []
            try:
                start_s, each_start_s = start_gateways(
                    configs, gateways, workdir=workdir, profile=cprofile, timeout=300.0
                )
                who = "the gateway" if settings.gateways == 1 else "every gateway"
                progress(f"{who} answered /healthz after {start_s:.1f}s")
                profiling: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
                if under_py_spy and settings.profile is not None:
                    profiling = py_spy_attached(gateways[0].process.pid, settings.profile)
                with profiling:
                    result, counters = asyncio.run(
                        run_load(settings, gateways, slack.url, database, probe_database)
                    )
            finally:
                exit_codes = stop_gateways(gateways)
                log_levels = [gateway.log_levels() for gateway in gateways]
                for (name, _, _), gateway, code, levels in zip(
                    configs, gateways, exit_codes, log_levels, strict=False
                ):
                    if code != 0 or {"error", "critical", "unparsed"} & levels.keys():
                        progress(f"{name} exit code {code}; its log ends:\n{gateway.tail()}")
                if settings.logs is not None:
                    settings.logs.mkdir(parents=True, exist_ok=True)
                    for log_file in workdir.glob("*.log"):
                        shutil.copy(log_file, settings.logs / log_file.name)
        time.sleep(0.5)  # the gateways' backends are still exiting
        after = read_database_counters(database_url(settings.admin_url, database))
    answered = max(settings.messages, 1)
    result["database_work_per_message"] = database_work(counters, after, messages=answered)
    peak = together([gateway.final for gateway in gateways]).peak_rss_mb
    result["gateway_peak_rss_mb"] = None if peak is None else round(peak, 1)
    result["gateway_start_s"] = round(start_s, 1)
    result["gateway_exit_code"] = first_failure(exit_codes)
    all_lines = sum((Counter(levels) for levels in log_levels), Counter[str]())
    result["gateway_log_lines"] = dict(all_lines)
    result["errors"] += sum(all_lines[level] for level in ("error", "critical"))
    for entry, gateway, seconds, code, levels in zip(
        result["per_gateway"], gateways, each_start_s, exit_codes, log_levels, strict=True
    ):
        peak = gateway.final.peak_rss_mb
        entry["peak_rss_mb"] = None if peak is None else round(peak, 1)
        entry["start_s"] = round(seconds, 1)
        entry["exit_code"] = code
        entry["log_lines"] = levels
    if cprofile is not None and cprofile.exists():
        result["profile"] = {"tool": "cProfile (whole process)", **profile_top(cprofile)}
    elif under_py_spy:
        result["profile"] = {"tool": "py-spy (the whole run)", "output": str(settings.profile)}
    return result


def parse_settings(argv: Sequence[str] | None) -> BenchSettings:
    """The command line."""
    parser = argparse.ArgumentParser(
        description="Slack DM events end to end: msgs/s, ack, overhead, CPU, memory, losses."
    )
    parser.add_argument("--users", type=int, default=1000, help="users, round-robin (1000)")
    parser.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="gateway processes on the one database, sent the events in turn (1)",
    )
    parser.add_argument("--rate", type=float, help="messages/s, open loop (default: closed loop)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="closed loop: messages in flight end to end; open loop: requests in flight (64)",
    )
    parser.add_argument("--messages", type=int, default=5000, help="measured messages (5000)")
    parser.add_argument(
        "--llm-latency", type=float, default=0.0, help="seconds the fake model takes (0)"
    )
    parser.add_argument("--warmup", type=int, default=200, help="uncounted messages first (200)")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for the replies (120)"
    )
    parser.add_argument(
        "--db-probe-seconds", type=float, default=5.0, help="each database probe's length (5)"
    )
    parser.add_argument("--database-url", default=DEFAULT_ADMIN_URL, help="admin URL")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--profile", type=Path, help="profile the gateway into FILE")
    parser.add_argument("--logs", type=Path, help="copy every process's log into DIR")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a gateway config key, e.g. sessions.max_concurrent_turns=200 (YAML)",
    )
    args = parser.parse_args(argv)
    overrides = []
    for item in args.set:
        key, equals, value = item.partition("=")
        if not equals or not key:
            parser.error(f"--set {item}: expected KEY=VALUE")
        overrides.append((key, yaml.safe_load(value)))
    if min(args.users, args.gateways, args.concurrency, args.messages) < 1 or args.warmup < 0:
        parser.error(
            "--users, --gateways, --concurrency and --messages must be positive, --warmup >= 0"
        )
    if args.users > 100_000:
        parser.error("--users: at most 100000 (Slack ids are U00000…U99999)")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    if args.llm_latency < 0 or not math.isfinite(args.llm_latency):
        parser.error("--llm-latency must be a number of seconds >= 0")
    return BenchSettings(
        users=args.users,
        gateways=args.gateways,
        rate=args.rate,
        concurrency=args.concurrency,
        messages=args.messages,
        llm_latency=args.llm_latency,
        warmup=args.warmup,
        timeout=args.timeout,
        admin_url=args.database_url,
        keep=args.keep,
        profile=args.profile,
        logs=args.logs,
        db_probe_seconds=args.db_probe_seconds,
        overrides=tuple(overrides),
    )


def _interrupt_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: processes stopped, database dropped


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    settings = parse_settings(argv)
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    try:
        result = run(settings)
    except BenchError as exc:
        progress(str(exc))
        return 2
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    print(json.dumps(result, indent=2))
    return 1 if result["lost"] or result["duplicates"] else 0


if __name__ == "__main__":
    sys.exit(main())
