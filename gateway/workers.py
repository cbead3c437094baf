"""Turn workers: the processes that run turns beside the one that accepts messages.

With `server.turn_workers: N`, `gateway run` serves HTTP and email and commits what arrives,
and starts N children (`gateway run --role turns --worker I` with the same config) that run
the dispatcher, the outbox and the background jobs, each first for its share of the senders
(`storage.inbox_signal`). Accepting then never waits behind a turn
for the CPU, and the turns use another core. The children are supervised: one that exits is
started again (after a pause that grows while it keeps failing), and all of them are stopped
with SIGTERM (SIGKILL after the grace period) when the gateway stops. Nothing is lost when a
worker dies: its turns' events are still pending, its replies' leases run out, and another
worker (or the restarted one) takes them up.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from gateway.log import get_logger

log = get_logger(__name__)

MAX_RESTART_DELAY = 30.0
STABLE_AFTER = 60.0  # a worker that ran this long restarts without delay when it exits


class TurnWorkers:
    """Starts, watches and stops the turn worker processes."""

    def __init__(self, count: int, config_path: Path | None, *, log_format: str | None) -> None:
        self.count = count
        self.command = [sys.executable, "-m", "gateway", "run", "--role", "turns"]
        if config_path is not None:
            self.command += ["--config", str(config_path)]
        if log_format is not None:
            self.command += ["--log-format", log_format]
        self._processes: dict[int, asyncio.subprocess.Process] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    def start(self) -> None:
        """Start every worker and its supervisor."""
        for index in range(self.count):
            self._tasks.append(
                asyncio.create_task(self._supervise(index), name=f"turn-worker-{index}")
            )

    async def _supervise(self, index: int) -> None:
        delay = 1.0
        loop = asyncio.get_running_loop()
        while not self._stopping:
            process = await asyncio.create_subprocess_exec(*self.command, "--worker", str(index))
            self._processes[index] = process
            started = loop.time()
            log.info("workers.started", worker=index, pid=process.pid)
            code = await process.wait()
            if self._stopping:
                return
            log.error("workers.exited", worker=index, pid=process.pid, exit_code=code)
            delay = (
                1.0 if loop.time() - started > STABLE_AFTER else min(delay * 2, MAX_RESTART_DELAY)
            )
            await asyncio.sleep(delay)

    def reload(self) -> None:
        """Pass SIGHUP on: each worker reads the config file again and applies it."""
        for process in self._processes.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGHUP)

    async def stop(self, *, grace: float = 30.0) -> None:
        """SIGTERM every worker, wait up to `grace` seconds, then SIGKILL what is left."""
        self._stopping = True
        running = [p for p in self._processes.values() if p.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        waits = [asyncio.create_task(process.wait()) for process in running]
        if waits:
            _, unfinished = await asyncio.wait(waits, timeout=grace)
            for process in running:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            if unfinished:
                log.warning("workers.killed", count=len(unfinished))
                await asyncio.gather(*unfinished, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
