"""Serving the gateway: the runtime, the HTTP server, and an orderly shutdown on signals."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import structlog
import uvicorn

from gateway.app import create_app
from gateway.log import get_logger
from gateway.reload import reload_config
from gateway.runtime import GatewayRuntime
from gateway.settings import GatewayConfig
from gateway.workers import TurnWorkers
from primitives.collector import settle_after_start

log = get_logger(__name__)


# Seconds the responses still open when the server stops may take to finish; then they are
# cancelled (the platforms resend what was not acknowledged; web clients reconnect).
SHUTDOWN_GRACE = 10
TURN_WORKER_NICENESS = 5
"""How much lower a turn worker's scheduling priority is than the accepting process's (under
Linux's scheduler a niceness of 5 weighs about a third)."""


class GatewayServer(uvicorn.Server):
    """uvicorn's server for the gateway: it leaves signals to `serve`, and ends the channels'
    long-lived responses (the web channel's event streams) as soon as it starts to stop.

    uvicorn's shutdown waits for every open response; an event stream stays open for up to
    its `max_seconds`, so without this a stop would wait for it (25 s by default).
    """

    def __init__(self, config: uvicorn.Config, runtime: GatewayRuntime) -> None:
        super().__init__(config)
        self.runtime = runtime

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Leave signals to `serve`, which stops the server and then closes the runtime."""
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop accepting connections, stop the channels, then let uvicorn finish the
        requests in flight."""
        for server in self.servers:
            server.close()  # uvicorn closes them again, which asyncio allows
        await stop_channels(self.runtime)
        await super().shutdown(sockets)


def http_server(runtime: GatewayRuntime, host: str, port: int) -> GatewayServer:
    """The HTTP server of a running gateway, on `host`:`port`."""
    return GatewayServer(
        uvicorn.Config(
            create_app(runtime),
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
            # The C parser (a dependency): about 8 % less CPU a message than h11 and 10 %
            # more messages a second in `bench/e2e.py`.
            http="httptools",
            timeout_graceful_shutdown=SHUTDOWN_GRACE,
        ),
        runtime,
    )


async def stop_channels(runtime: GatewayRuntime) -> None:
    """Stop the channels' adapters when the server starts to stop: listeners close and open
    event streams end (their clients reconnect to another process) instead of holding the
    shutdown. Turns in flight still finish; `GatewayRuntime.close` stops the adapters again,
    which they allow. A failure is logged and does not hold up the rest of the shutdown."""
    for channel_type, adapter in runtime.adapters.items():
        try:
            await adapter.stop()
        except Exception:
            log.exception("channel.stop_failed", channel=channel_type.value)


async def serve(
    config: GatewayConfig,
    config_path: Path | None = None,
    *,
    role: Literal["all", "turns"] = "all",
    log_format: str | None = None,
    worker: int = 0,
) -> None:
    """Start the runtime, serve until SIGTERM/SIGINT, then shut down in order.

    On the first signal uvicorn stops accepting connections, the channels stop (open event
    streams end) and in-flight requests get `SHUTDOWN_GRACE` seconds to finish; a second
    signal forces the exit. The runtime closes only after the server stops.
    SIGHUP reads `config_path` again and applies it (`gateway.reload`). With
    `server.turn_workers`, this process only accepts and starts the turn workers
    (`gateway.workers`); `role="turns"` is such a worker (number `worker`): no HTTP, turns
    only.
    """
    if role == "turns":
        await _serve_turns(config, config_path, worker)
        return
    workers = None
    if config.server.turn_workers:
        workers = TurnWorkers(config.server.turn_workers, config_path, log_format=log_format)
    runtime = await GatewayRuntime.start(config, role="accept" if workers else "all")
    try:
        server = http_server(runtime, config.server.host, config.server.port)
        loop = asyncio.get_running_loop()

        def request_stop(signum: signal.Signals) -> None:
            log.info("gateway.stopping", signal=signum.name, forced=server.should_exit)
            server.force_exit = server.should_exit
            server.should_exit = True

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, request_stop, signum)
        reloads: set[asyncio.Task[bool]] = set()

        def request_reload() -> None:
            log.info("config.reloading", path=str(config_path))
            if workers is not None:
                workers.reload()
            task = asyncio.create_task(reload_config(runtime, config_path))
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, request_reload)
        runtime.start_background()
        if workers is not None:
            workers.start()
        settle_after_start()
        log.info(
            "http.listening",
            host=config.server.host,
            port=config.server.port,
            turn_workers=config.server.turn_workers,
        )
        await server.serve()
    finally:
        if workers is not None:
            await workers.stop()
        await runtime.close()


async def _serve_turns(config: GatewayConfig, config_path: Path | None, worker: int) -> None:
    """A turn worker: run turns, send replies and the jobs until SIGTERM/SIGINT.

    It runs at a lower scheduling priority (`TURN_WORKER_NICENESS`): on a host whose cores are
    full, the process that accepts (and acknowledges within the platforms' deadlines) gets
    the CPU first and the turns take what is left; on a host with cores to spare it changes
    nothing."""
    os.nice(TURN_WORKER_NICENESS)
    structlog.contextvars.bind_contextvars(worker=worker)  # on every line of this process
    runtime = await GatewayRuntime.start(config, role="turns", worker=worker)
    stopped = asyncio.Event()
    try:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopped.set)
        reloads: set[asyncio.Task[bool]] = set()

        def request_reload() -> None:
            task = asyncio.create_task(reload_config(runtime, config_path))
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, request_reload)
        runtime.start_background()
        watch = asyncio.create_task(_stop_when_orphaned(stopped), name="parent-watch")
        settle_after_start()
        log.info("workers.ready")
        await stopped.wait()
        watch.cancel()
        log.info("gateway.stopping", role="turns")
    finally:
        await runtime.close()


async def _stop_when_orphaned(stopped: asyncio.Event, interval: float = 1.0) -> None:
    """Stop the worker when the process that started it is gone (killed without passing
    the signal on): a worker must not outlive its gateway."""
    parent = os.getppid()
    while not stopped.is_set():
        await asyncio.sleep(interval)
        if os.getppid() != parent:
            log.warning("workers.orphaned", parent=parent)
            stopped.set()
