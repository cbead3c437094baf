"""Run a whole gateway in the test's event loop, on a real loopback socket, with a clock the
test can move; and small HTTP helpers for the web channel."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import uvicorn

from gateway.app import create_app
from gateway.runtime import GatewayRuntime
from gateway.settings import GatewayConfig

FEED_PAGE = 100  # replies per page asked of the web feed


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class MovableClock:
    """Real time plus an offset the test can add to (`advance`)."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, delta: timedelta) -> None:
        self.offset += delta


def gateway_client(base_url: str = "") -> httpx.AsyncClient:
    """An HTTP client for a gateway under test. It keeps an idle connection for 1 s only:
    uvicorn closes one after 5 s (`timeout_keep_alive`), and a request sent on a connection
    the server is closing at that moment fails (`httpx.ReadError`) with httpx's own default
    of 5 s, as a test that waits a few seconds between two requests once did."""
    return httpx.AsyncClient(
        base_url=base_url, timeout=10, limits=httpx.Limits(keepalive_expiry=1.0)
    )


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class RunningGateway:
    runtime: GatewayRuntime
    client: httpx.AsyncClient
    clock: MovableClock

    async def post(self, user: str, text: str, **fields: Any) -> httpx.Response:
        return await self.client.post(
            "/web/v1/messages", json={"user": user, "text": text, **fields}
        )

    async def wait_for_turns_to_end(self, user: str, *, timeout: float = 15.0) -> None:
        """Wait until this process no longer answers the user's queue: a reply is visible
        once committed, before the work that follows it (transcript, topic) releases the
        user's turn lock."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.runtime.dispatcher.is_draining(user):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{user}'s turns still running after {timeout} s")
            await asyncio.sleep(0.01)

    async def replies(self, user: str, after: str = "", limit: int | None = None) -> dict[str, Any]:
        params = {"user": user, "after": after}
        if limit is not None:
            params["limit"] = str(limit)
        response = await self.client.get("/web/v1/messages", params=params)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    async def all_replies(self, user: str) -> list[dict[str, Any]]:
        """Every reply to `user`, following the cursor page by page."""
        messages: list[dict[str, Any]] = []
        cursor = ""
        while True:
            page = await self.replies(user, cursor, limit=FEED_PAGE)
            messages.extend(page["messages"])
            # A short page is the last: no need to ask for the empty one after it (the tests
            # poll this, so it halves their requests).
            if len(page["messages"]) < FEED_PAGE:
                return messages
            cursor = page["cursor"]

    async def wait_for_replies(
        self, user: str, count: int, *, timeout: float = 15.0, settle: float = 0.3
    ) -> list[dict[str, Any]]:
        """Poll the feed until `count` replies arrived; then wait `settle` seconds and fail if
        more arrived than expected."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            messages = await self.all_replies(user)
            if len(messages) >= count:
                if settle:
                    await asyncio.sleep(settle)  # a surplus reply would show up now
                    messages = await self.all_replies(user)
                assert len(messages) == count, messages
                return messages
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{len(messages)} of {count} replies after {timeout}s")
            await asyncio.sleep(0.05)


def gateway_config(database_url: str, tmp_path: Any, **sections: Any) -> GatewayConfig:
    """A config for tests: the given database, a local store in tmp_path, user alice (and bob)."""
    data: dict[str, Any] = {
        "storage": {
            "database_url": database_url,
            "transcripts": {"local_path": str(tmp_path / "transcripts")},
        },
        "organizations": [{"id": "acme", "name": "Acme", "context": "Acme makes anvils."}],
        "identity": {
            "users": [
                {"id": "alice", "org": "acme", "name": "Alice", "email": ["alice@acme.example"]},
                {"id": "bob", "org": "acme", "name": "Bob"},
            ]
        },
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return GatewayConfig.model_validate(data)


@contextlib.asynccontextmanager
async def running_gateway(config: GatewayConfig) -> AsyncIterator[RunningGateway]:
    """Start the runtime, its loops and the HTTP server; stop all of it afterwards."""
    clock = MovableClock()
    port = free_port()
    runtime = await GatewayRuntime.start(config, clock=clock)
    server = _QuietServer(
        uvicorn.Config(
            create_app(runtime),
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
    )
    runtime.start_background()
    serving = asyncio.create_task(server.serve())
    # The jobs' first pass runs at start; a test that runs a job itself then never races it.
    deadline = asyncio.get_running_loop().time() + 10
    while not server.started or (runtime.role != "accept" and runtime.jobs.passes == 0):
        if serving.done():
            serving.result()
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the gateway's server or its jobs' first pass did not start")
        await asyncio.sleep(0.01)
    client = gateway_client(f"http://127.0.0.1:{port}")
    try:
        yield RunningGateway(runtime, client, clock)
    finally:
        await client.aclose()
        server.should_exit = True
        await serving
        await runtime.close()
