"""Real `gateway run` processes: two sharing one PostgreSQL database, one killed mid-turn, and
turn workers (one killed, one hung)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select, text

from gateway.server import TURN_WORKER_NICENESS
from storage.database import Database
from storage.inbox_signal import TAKEOVER_AFTER
from storage.locks import advisory_key
from storage.models import InboundEvent, OutboundMessage, Session, SessionMessage
from tests.e2e.harness import free_port, gateway_client

ROOT = Path(__file__).resolve().parents[2]
START_SECONDS = 120  # a `gateway run` not serving /healthz by then has hung

# The tests that start `gateway run` processes and time them run one at a time, on one xdist
# worker (`--dist loadgroup`): several at once on two cores slow each other down past the
# windows the tests rely on (a turn held on the model for seconds, a stop within seconds).
GATEWAY_PROCESSES = pytest.mark.xdist_group("gateway_processes")
pytestmark = GATEWAY_PROCESSES


def write_config(
    tmp_path: Path,
    name: str,
    port: int,
    database_url: str,
    latency: str,
    turn_workers: int = 0,
    users: tuple[str, ...] = ("alice", "bob"),
) -> Path:
    listed = ", ".join(f"{{id: {user}, org: acme, name: {user.title()}}}" for user in users)
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"""
server: {{host: 127.0.0.1, port: {port}, turn_workers: {turn_workers}}}
storage:
  database_url: "{database_url}"
  transcripts: {{backend: local, local_path: "{tmp_path / "transcripts"}"}}
llm: {{offline_latency: {latency}}}
organizations: [{{id: acme, name: Acme}}]
identity:
  users: [{listed}]
"""
    )
    return path


class GatewayProcess:
    def __init__(self, config: Path, port: int, cwd: Path) -> None:
        self.config, self.port, self.cwd = config, port, cwd
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> GatewayProcess:
        with (self.cwd / f"gateway-{self.port}.log").open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway", "run", "--config", str(self.config)],
                cwd=self.cwd,
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        # Only a hang guard: starting takes ~6 s on an idle machine (mostly imports), several
        # times that while other tests compete for the CPU.
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_text()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        # Not left running for a later test's garbage collection to complain about.
        self.kill()
        raise AssertionError(f"gateway on {self.port} did not start:\n{self.log_text()}")

    def log_text(self) -> str:
        return (self.cwd / f"gateway-{self.port}.log").read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)


@pytest.fixture
def processes() -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    yield started
    for process in started:
        process.kill()


async def wait_for(condition: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not met in time")


async def test_two_processes_on_one_database_never_overlap_a_users_turns(
    tmp_path: Path, fresh_postgres_url: str, processes: list[GatewayProcess]
) -> None:
    ports = [free_port(), free_port()]
    for index, port in enumerate(ports):
        config = write_config(tmp_path, f"gw{index}", port, fresh_postgres_url, "100ms")
        processes.append(GatewayProcess(config, port, tmp_path).start())
    sent = [f"m{index:02d}" for index in range(20)]
    async with gateway_client() as client:
        for index, message_id in enumerate(sent):
            target = processes[index % 2].url
            response = await client.post(
                f"{target}/web/v1/messages",
                json={"user": "alice", "text": f"text {message_id}", "message_id": message_id},
            )
            assert response.status_code == 202

        async def all_answered() -> bool:
            feed = await client.get(f"{processes[0].url}/web/v1/messages", params={"user": "alice"})
            return len(feed.json()["messages"]) >= len(sent)

        await wait_for(all_answered)
        await asyncio.sleep(0.5)
        feed = (
            await client.get(f"{processes[1].url}/web/v1/messages", params={"user": "alice"})
        ).json()["messages"]

    database = Database(fresh_postgres_url)
    async with database.session() as db:
        transcript = list(
            (await db.execute(select(SessionMessage).order_by(SessionMessage.seq))).scalars()
        )
        arrival = list(
            (await db.execute(select(InboundEvent.message_id).order_by(InboundEvent.id))).scalars()
        )
        outbound = list((await db.execute(select(OutboundMessage))).scalars())
    await database.dispose()

    assert sorted(reply["in_reply_to"] for reply in feed) == sent
    assert len(outbound) == len(sent)
    assert len({m.session_id for m in transcript}) == 1
    assert [m.seq for m in transcript] == list(range(1, 2 * len(sent) + 1))
    # Turns never overlapped: strictly user, assistant, user, assistant …, each answer
    # replying to the message just before it, and the user messages in arrival order.
    assert [m.role for m in transcript] == ["user", "assistant"] * len(sent)
    for question, answer in zip(transcript[::2], transcript[1::2], strict=True):
        assert answer.in_reply_to == question.message_id
    assert [m.message_id for m in transcript[::2]] == arrival


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_turn_killed_midway_is_answered_once_after_restart(
    tmp_path: Path, processes: list[GatewayProcess], backend: str, request: pytest.FixtureRequest
) -> None:
    database_url = (
        f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
        if backend == "sqlite"
        else str(request.getfixturevalue("fresh_postgres_url"))
    )
    port = free_port()
    config = write_config(tmp_path, "gw", port, database_url, "3s")
    first = GatewayProcess(config, port, tmp_path).start()
    processes.append(first)
    database = Database(database_url)

    async def turn_waiting_on_the_model() -> bool:
        # The turn has routed the message to a new session; it stores nothing before the
        # model's answer, so the session is still empty.
        async with database.session() as db:
            sessions = list((await db.execute(select(Session.id))).scalars())
            rows = list((await db.execute(select(SessionMessage.role))).scalars())
        return len(sessions) == 1 and rows == []

    async with gateway_client() as client:
        response = await client.post(
            f"{first.url}/web/v1/messages",
            json={"user": "alice", "text": "survive this", "message_id": "k1"},
        )
        assert response.status_code == 202
        await wait_for(turn_waiting_on_the_model)
        first.kill(signal.SIGKILL)

        second = GatewayProcess(config, port, tmp_path).start()
        processes.append(second)

        async def answered() -> bool:
            feed = await client.get(f"{second.url}/web/v1/messages", params={"user": "alice"})
            return len(feed.json()["messages"]) >= 1

        await wait_for(answered)
        # A retry of the platform after the crash must not produce a second answer.
        retry = await client.post(
            f"{second.url}/web/v1/messages",
            json={"user": "alice", "text": "survive this", "message_id": "k1"},
        )
        assert retry.json()["duplicate"] is True
        await asyncio.sleep(0.5)
        feed = (await client.get(f"{second.url}/web/v1/messages", params={"user": "alice"})).json()[
            "messages"
        ]

    async with database.session() as db:
        roles = list(
            (await db.execute(select(SessionMessage.role).order_by(SessionMessage.seq))).scalars()
        )
        outbound = list((await db.execute(select(OutboundMessage))).scalars())
    await database.dispose()
    assert [reply["in_reply_to"] for reply in feed] == ["k1"]
    assert roles == ["user", "assistant"]
    assert len(outbound) == 1
    assert "survive this" in outbound[0].content


def worker_pids(parent: int) -> list[int]:
    """The pids of a gateway's turn workers (its children running `--role turns`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"turns" in command:
            found.append(int(entry.name))
    return found


async def test_an_accepting_gateway_with_a_turn_worker_answers_each_message_once(
    tmp_path: Path, fresh_postgres_url: str, processes: list[GatewayProcess]
) -> None:
    port = free_port()
    config = write_config(tmp_path, "gw", port, fresh_postgres_url, "200ms", turn_workers=1)
    gateway = GatewayProcess(config, port, tmp_path).start()
    processes.append(gateway)
    assert gateway.process is not None
    users = ("alice", "bob")
    async with gateway_client() as client:

        async def answered(count: int) -> bool:
            feeds = [
                (await client.get(f"{gateway.url}/web/v1/messages", params={"user": u})).json()
                for u in users
            ]
            return sum(len(feed["messages"]) for feed in feeds) >= count

        async def post(index: int) -> None:
            response = await client.post(
                f"{gateway.url}/web/v1/messages",
                json={
                    "user": users[index % 2],
                    "text": f"question {index}",
                    "message_id": f"q{index}",
                },
            )
            assert response.status_code == 202

        for index in range(10):
            await post(index)
        await wait_for(lambda: answered(10))
        # A worker that dies mid-turn is started again; the turns it held are answered once.
        (worker,) = worker_pids(gateway.process.pid)
        # The turns yield the CPU to the process that acknowledges.
        accepting = os.getpriority(os.PRIO_PROCESS, gateway.process.pid)
        assert os.getpriority(os.PRIO_PROCESS, worker) == accepting + TURN_WORKER_NICENESS
        for index in range(10, 20):
            await post(index)
        os.kill(worker, signal.SIGKILL)
        await wait_for(lambda: answered(20), timeout=120)
        await asyncio.sleep(0.5)
        (restarted,) = worker_pids(gateway.process.pid)
        assert restarted != worker
        replies = [
            reply
            for u in users
            for reply in (
                await client.get(f"{gateway.url}/web/v1/messages", params={"user": u})
            ).json()["messages"]
        ]
    assert sorted(reply["in_reply_to"] for reply in replies) == sorted(f"q{i}" for i in range(20))
    assert "workers.started" in gateway.log_text()
    # A worker does not outlive its gateway, even one killed without passing the signal on.
    gateway.kill(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{restarted}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not Path(f"/proc/{restarted}").exists()


def two_worker_gateway(
    tmp_path: Path, database_url: str, users: tuple[str, ...], processes: list[GatewayProcess]
) -> GatewayProcess:
    """A gateway with two turn workers, started, both of them ready.

    A worker ready late (each imports for seconds, longer while other tests compete for the
    CPU) would find its share's events already waited `TAKEOVER_AFTER` and taken over by the
    other: what the gateway should do then, but not what these tests look at."""
    port = free_port()
    config = write_config(tmp_path, "gw", port, database_url, "50ms", turn_workers=2, users=users)
    gateway = GatewayProcess(config, port, tmp_path).start()
    processes.append(gateway)
    deadline = time.monotonic() + START_SECONDS
    while ready_workers(gateway) != {0, 1}:
        assert time.monotonic() < deadline, f"workers not ready:\n{gateway.log_text()}"
        time.sleep(0.1)
    return gateway


def ready_workers(gateway: GatewayProcess) -> set[int]:
    """The turn workers that have said they are ready (from the JSON log; a line still being
    written is read at the next look)."""
    ready: set[int] = set()
    for line in gateway.log_text().splitlines():
        if '"workers.ready"' in line:
            with contextlib.suppress(ValueError):
                ready.add(json.loads(line)["worker"])
    return ready


def turn_workers_of(gateway: GatewayProcess) -> dict[str, list[int]]:
    """Each user's turns, by the worker that started them, in order (from the JSON log)."""
    workers: dict[str, list[int]] = {}
    for line in gateway.log_text().splitlines():
        if '"turn.started"' in line:
            entry = json.loads(line)
            workers.setdefault(entry["user_id"], []).append(entry["worker"])
    return workers


async def test_two_turn_workers_each_answer_their_own_share_of_the_senders(
    tmp_path: Path, fresh_postgres_url: str, processes: list[GatewayProcess]
) -> None:
    """Alice's and Carol's web keys fall in different shares of two workers (`hashtext`,
    computed by PostgreSQL): each is told of and answers its own, none waits for the other's
    poll to take it over."""
    users = ("alice", "carol")
    gateway = two_worker_gateway(tmp_path, fresh_postgres_url, users, processes)
    async with gateway_client() as client:
        for index in range(6):
            response = await client.post(
                f"{gateway.url}/web/v1/messages",
                json={"user": users[index % 2], "text": f"q {index}", "message_id": f"s{index}"},
            )
            assert response.status_code == 202

        async def answered() -> bool:
            feeds = [
                (await client.get(f"{gateway.url}/web/v1/messages", params={"user": u})).json()
                for u in users
            ]
            return sum(len(feed["messages"]) for feed in feeds) >= 6

        await wait_for(answered)
    assert {user: set(workers) for user, workers in turn_workers_of(gateway).items()} == {
        "alice": {0},
        "carol": {1},
    }


def worker_pid(parent: int, index: int) -> int:
    """The pid of the gateway's turn worker `index` (started with `--worker index`)."""
    for pid in worker_pids(parent):
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if arguments[arguments.index(b"--worker") + 1] == str(index).encode():
            return pid
    raise AssertionError(f"no turn worker {index} under {parent}")


async def test_a_hung_workers_senders_are_taken_over_by_another_and_answered_once(
    tmp_path: Path, fresh_postgres_url: str, processes: list[GatewayProcess]
) -> None:
    """Carol's key is worker 1's share (see above). While worker 1 is stopped (alive, so not
    restarted: a hung process), worker 0's poll takes her message once it has waited
    `TAKEOVER_AFTER`; when worker 1 runs again it does not answer it a second time."""
    users = ("alice", "carol")
    gateway = two_worker_gateway(tmp_path, fresh_postgres_url, users, processes)
    assert gateway.process is not None
    async with gateway_client() as client:

        async def post(user: str, message_id: str) -> None:
            response = await client.post(
                f"{gateway.url}/web/v1/messages",
                json={"user": user, "text": f"q {message_id}", "message_id": message_id},
            )
            assert response.status_code == 202

        async def replies_to(user: str) -> list[str]:
            feed = await client.get(f"{gateway.url}/web/v1/messages", params={"user": user})
            return [reply["in_reply_to"] for reply in feed.json()["messages"]]

        for user in users:
            await post(user, f"warm-{user}")
        for user in users:
            await wait_for(lambda user=user: _has(replies_to(user), f"warm-{user}"))
        # The reply shows before its turn is over (its topic, the drain's next read): a
        # worker stopped before then would hang holding carol's turn lock, which no other
        # worker may take. This test stops an idle worker.
        database = Database(fresh_postgres_url)
        try:
            await wait_for(lambda: turn_lock_free(database, "carol"))
        finally:
            await database.dispose()
        hung = worker_pid(gateway.process.pid, 1)
        os.kill(hung, signal.SIGSTOP)
        try:
            posted = time.monotonic()
            await post("carol", "while-hung")
            await wait_for(lambda: _has(replies_to("carol"), "while-hung"), timeout=90)
            waited = time.monotonic() - posted
        finally:
            os.kill(hung, signal.SIGCONT)
        await asyncio.sleep(3)  # worker 1 hears of the event again, finds it answered
        assert sorted(await replies_to("carol")) == ["warm-carol", "while-hung"]
    assert waited >= TAKEOVER_AFTER.total_seconds() - 1
    assert turn_workers_of(gateway) == {"alice": [0], "carol": [1, 0]}


async def turn_lock_free(database: Database, user_id: str) -> bool:
    """Whether no process holds the user's turn lock (taken here and given back at once)."""
    number = advisory_key(f"user:{user_id}")
    async with database.session() as db:
        taken = await db.scalar(text("SELECT pg_try_advisory_lock(:n)"), {"n": number})
        if taken:
            await db.execute(text("SELECT pg_advisory_unlock(:n)"), {"n": number})
        return bool(taken)


async def _has(replies: Awaitable[list[str]], message_id: str) -> bool:
    return message_id in await replies
