"""The load generator of `e2e.py`: signed Slack `message.im` events sent over keep-alive
connections to the gateways in turn, in a closed loop or at a fixed rate (open loop), and the
watcher that matches the fake Slack API's posts to the events by the token in their text."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from benchkit import progress

from tests.fakes.slack_api import direct_message, event_envelope, sign

TOKEN = re.compile(r"\b([0-9a-f]{6}n\d{7})\b")
POST_POLL_SECONDS = 0.02  # how often the fake Slack API's new posts are read
KEEP_ALIVE_SECONDS = 4.0  # uvicorn closes idle connections after 5 s: reconnect before that


@dataclass(slots=True)
class Sent:
    """One event: when it was due (wall clock), its acknowledgement, or what went wrong."""

    index: int  # numbers every event of the run, warm-up first
    token: str
    user: int
    due_at: float = 0.0
    ack_s: float | None = None
    error: str | None = None


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
    """Reads the fake Slack API's posts as they arrive and matches them to events by token.

    A live reply is posted with its first words and edited as the model writes (`chat.update`):
    its answer arrives with the edit that first holds its token. A post that no edit ever
    completed with a token is unmatched."""

    def __init__(self, slack_url: str) -> None:
        self._client = httpx.AsyncClient(base_url=slack_url, timeout=30)
        self.read = 0
        self.at: dict[str, list[float]] = {}  # token → when each post for it arrived
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._matched: set[str] = set()  # messages (ts) whose text had a token
        self._tokenless: dict[str, str] = {}  # ts → text of a post still without one

    async def fetch(self) -> None:
        """Read the posts that came since the last call."""
        response = await self._client.get("/_posts", params={"after": str(self.read)})
        response.raise_for_status()
        posts: list[dict[str, Any]] = response.json()
        self.read += len(posts)
        for post in posts:
            ts, text = str(post["ts"]), str(post["text"])
            tokens = TOKEN.findall(text)
            if ts in self._matched:
                continue  # a later edit of an answer already counted
            if not tokens:
                if not post["edited"]:
                    self._tokenless[ts] = text[:160]
                continue
            self._tokenless.pop(ts, None)
            self._matched.add(ts)
            token = tokens[-1]  # merged messages: the turn answers the latest
            self.at.setdefault(token, []).append(float(post["at"]))
            waiter = self._waiters.pop(token, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    @property
    def unmatched(self) -> list[str]:
        """The texts of the posts that no token matched, not even in an edit."""
        return list(self._tokenless.values())

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
