"""The gateway being measured: its config (PostgreSQL, local transcripts, the offline LLM,
the open web channel for the benchmark's users), and `python -m gateway run` as a process of
its own on a free loopback port, healthy before the load and stopped with SIGTERM after it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from benchkit import BenchError, progress
from routing_cpu import ProcessSample, read_process

PROJECT_ROOT = Path(__file__).resolve().parents[1]


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
