"""Slack Events API acknowledgement latency on PostgreSQL with the offline LLM.

A gateway process (`python -m gateway run`, throwaway PostgreSQL database, Slack channel in
HTTP mode) receives signed DM events (`message.im`, HMAC-SHA256 over `v0:{ts}:{body}`, as
Slack sends them) at a fixed rate (open loop: latency counts from the moment an event was due,
so a gateway that falls behind cannot hide its queue). Its replies go to a fake Slack Web API
on loopback (a process of its own, `python -m tests.fakes.slack_api`, so that answering the
gateway takes no CPU from the load generator), which records `chat.postMessage` calls.

Printed as one JSON object: `ack_ms` (p50/p90/p99/max of the HTTP 200), `sent_per_s`, the
failed acknowledgements, and, once every reply arrived (or `--timeout` passed), `lost` and
`duplicates` over the replies; the goal (p99 ≤ 50 ms at 200 events/s) and whether it was met.

    .venv/bin/python bench/slack_ack.py                       # 3000 events at 200/s
    .venv/bin/python bench/slack_ack.py --events 6000 --rate 400 --users 500

Exit code 1 when a reply was lost or duplicated, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from benchkit import BenchError, progress, throwaway_database
from routing import (
    DEFAULT_ADMIN_URL,
    GatewayProcess,
    database_url,
    free_port,
    percentiles_ms,
    write_config,
)

from tests.fakes.slack_api import SIGNING_SECRET, TEAM, direct_message, event_envelope, sign

GOAL_ACK_P99_MS = 50.0


@dataclass(frozen=True, slots=True)
class Ack:
    """The answer to one event: latency from when it was due, or the error."""

    event_id: str
    channel: str
    latency_s: float
    error: str | None


@contextlib.contextmanager
def fake_slack_process() -> Iterator[str]:
    """Run the fake Slack Web API as a process; yield its base URL (without `/api/`)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.slack_api", "--port", str(port)],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{url}/_posted", timeout=1).raise_for_status()
                break
            if time.monotonic() > deadline or process.poll() is not None:
                raise BenchError("the fake Slack API did not start")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def posted_channels(fake_url: str) -> list[str]:
    """The DM channels the gateway posted replies to, one entry per `chat.postMessage`."""
    channels: list[str] = httpx.get(f"{fake_url}/_posted", timeout=30).json()
    return channels


def slack_overrides(fake_url: str, users: int) -> list[tuple[str, object]]:
    """Config for a Slack-only gateway whose users are U00001… in workspace T0001."""
    return [
        ("logging.level", "warning"),
        ("channels.web.enabled", False),
        (
            "channels.slack",
            {
                "enabled": True,
                "mode": "http",
                "bot_token": "xoxb-bench",
                "signing_secret": SIGNING_SECRET,
                "api_base_url": f"{fake_url}/api/",
            },
        ),
        (
            "identity.users",
            [
                {"id": f"u{n:05d}", "org": "acme", "slack": [f"{TEAM}:U{n:05d}"]}
                for n in range(users)
            ],
        ),
    ]


async def send_events(base_url: str, *, events: int, rate: float, users: int) -> list[Ack]:
    """Send `events` signed DMs at `rate` per second, round-robin over the users."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30) as client:
        start = time.perf_counter() + 0.2

        async def one(index: int) -> Ack:
            due = start + index / rate
            await asyncio.sleep(max(due - time.perf_counter(), 0))
            user = index % users
            event = direct_message(
                f"message {index}",
                user=f"U{user:05d}",
                ts=f"{1_800_000_000 + index}.000100",
                channel=f"D{user:05d}",
            )
            envelope = event_envelope(event, f"EvBench{index:07d}")
            body = json.dumps(envelope).encode()
            headers = {"Content-Type": "application/json", **sign(body)}
            try:
                answer = await client.post("/slack/events", content=body, headers=headers)
                error = None if answer.status_code == 200 else f"HTTP {answer.status_code}"
            except httpx.HTTPError as exc:
                error = repr(exc)
            return Ack(envelope["event_id"], event["channel"], time.perf_counter() - due, error)

        return list(await asyncio.gather(*(one(index) for index in range(events))))


def wait_for_replies(fake_url: str, expected: int, timeout: float) -> float:
    """Seconds until `expected` replies were posted (or the timeout passed)."""
    started = time.monotonic()
    while len(posted_channels(fake_url)) < expected and time.monotonic() - started < timeout:
        time.sleep(0.5)
    time.sleep(1.0)  # a duplicate would show up now
    return time.monotonic() - started


def audit(acks: list[Ack], fake_url: str) -> dict[str, int]:
    """Replies per DM channel against the events acknowledged in it."""
    sent = Counter(ack.channel for ack in acks if ack.error is None)
    posted = Counter(posted_channels(fake_url))
    lost = sum(max(count - posted[channel], 0) for channel, count in sent.items())
    duplicates = sum(max(count - sent[channel], 0) for channel, count in posted.items())
    return {"lost": lost, "duplicates": duplicates, "replies": sum(posted.values())}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=200.0, help="events per second")
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for replies")
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN_URL)
    args = parser.parse_args(argv)
    try:
        with (
            fake_slack_process() as fake_url,
            tempfile.TemporaryDirectory(prefix="gateway-bench-") as folder,
            throwaway_database(args.admin_url) as database,
        ):
            workdir = Path(folder)
            port = free_port()
            config = write_config(
                workdir,
                port=port,
                database_url=database_url(args.admin_url, database, driver="psycopg"),
                users=[],
                overrides=slack_overrides(fake_url, args.users),
            )
            progress(f"starting the gateway on port {port} (database {database})")
            gateway = GatewayProcess.start(config, port=port, workdir=workdir, profile=None)
            try:
                progress(f"sending {args.events} signed events at {args.rate}/s")
                began = time.perf_counter()
                acks = asyncio.run(
                    send_events(
                        gateway.base_url, events=args.events, rate=args.rate, users=args.users
                    )
                )
                sending_s = time.perf_counter() - began
                accepted = sum(ack.error is None for ack in acks)
                progress(f"{accepted} acknowledged; waiting for the replies")
                waited = wait_for_replies(fake_url, accepted, args.timeout)
                correctness = audit(acks, fake_url)
            finally:
                gateway.stop()
    except BenchError as exc:
        progress(str(exc))
        return 2
    ack_ms = percentiles_ms([ack.latency_s for ack in acks if ack.error is None])
    result: dict[str, Any] = {
        "events": args.events,
        "rate_per_s": args.rate,
        "users": args.users,
        "sent_per_s": round(args.events / sending_s, 1),
        "ack_ms": ack_ms,
        "ack_errors": Counter(ack.error for ack in acks if ack.error is not None),
        "replies_done_after_s": round(waited, 1),
        **correctness,
        "goal_ack_p99_ms": GOAL_ACK_P99_MS,
        "goal_met": ack_ms["p99"] is not None and ack_ms["p99"] <= GOAL_ACK_P99_MS,
    }
    print(json.dumps(result, indent=2))
    return 1 if correctness["lost"] or correctness["duplicates"] else 0


if __name__ == "__main__":
    sys.exit(main())
