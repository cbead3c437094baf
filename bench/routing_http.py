"""The load generator's HTTP: keep-alive connections to the gateway, `POST /web/v1/messages`
sent in a closed or an open loop with an `Ack` for each, a user's reply feed read page by page,
and the finished turns counted by `/metrics`."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx
from benchkit import progress

FEED_PAGE = 500  # the largest `limit` the feed accepts


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
