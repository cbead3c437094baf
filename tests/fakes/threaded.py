"""Serving a fake's ASGI app with uvicorn on a thread of its own, for tests and benchmarks that
run their own event loop (or none)."""

from __future__ import annotations

import threading
import time

import uvicorn
from starlette.types import ASGIApp


class ThreadedServer:
    """`start()` serves `app` on 127.0.0.1:`port` and returns once it listens; `stop()` ends it."""

    def __init__(self, app: ASGIApp, port: int, name: str, *, lifespan: bool = False) -> None:
        self.name = name
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=port,
                log_config=None,
                lifespan="on" if lifespan else "off",
            )
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self) -> None:
        """Start serving; raise `RuntimeError` if the server is not up within 10 seconds."""
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {self.name} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Ask the server to exit and wait for its thread."""
        self._server.should_exit = True
        self._thread.join(timeout=10)
