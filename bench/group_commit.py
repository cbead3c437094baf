"""Group commit at the gateway's edges on PostgreSQL: the inbox, the outbox's delivery marks and
the turn locks, with many callers at once.

Prints JSON: for each part, calls per second, commits per call (counted by the database,
`pg_stat_database.xact_commit`, and by the engine), and the process's CPU milliseconds per
call. `--max-batch 1` runs the same code one call per transaction, as before group commit.

    .venv/bin/python bench/group_commit.py --callers 64 --calls 20000
    .venv/bin/python bench/group_commit.py --callers 64 --calls 20000 --max-batch 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from benchkit import BenchError, progress, throwaway_database
from sqlalchemy import event, make_url

from channels.base import ChannelMessage, ChannelType, DeliveryReceipt, OutboundMessage
from gateway.inbox import Inbox
from gateway.log import configure_logging
from gateway.metrics import GatewayMetrics
from gateway.outbox import OutboxSender
from storage.database import Database
from storage.locks import PostgresTurnLocks
from storage.repositories.outbox import OutboxRepository

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
T0 = datetime(2025, 6, 1, tzinfo=UTC)


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def server_commits(url: str) -> int:
    with psycopg.connect(libpq(url), autocommit=True) as connection:
        row = connection.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


@contextlib.contextmanager
def engine_counts(database: Database) -> Iterator[dict[str, int]]:
    counts = {"commits": 0, "statements": 0}

    def on_commit(_connection: Any) -> None:
        counts["commits"] += 1

    def on_statement(*_args: Any) -> None:
        counts["statements"] += 1

    engine = database.engine.sync_engine
    event.listen(engine, "commit", on_commit)
    event.listen(engine, "before_cursor_execute", on_statement)
    try:
        yield counts
    finally:
        event.remove(engine, "commit", on_commit)
        event.remove(engine, "before_cursor_execute", on_statement)


async def closed_loop(callers: int, calls: int, call: Callable[[int], Awaitable[None]]) -> None:
    """`callers` tasks, each making its next call as soon as the previous one returned."""
    counter = iter(range(calls))

    async def caller() -> None:
        for number in counter:
            await call(number)

    await asyncio.gather(*(caller() for _ in range(callers)))


@contextlib.asynccontextmanager
async def measured(
    name: str, url: str, database: Database, calls: int, results: dict[str, Any]
) -> AsyncIterator[dict[str, int]]:
    before = server_commits(url)
    cpu, wall = time.process_time(), time.perf_counter()
    with engine_counts(database) as counts:
        yield counts
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # Backends report their statistics when they go idle (at most once a second) or exit.
    await database.engine.dispose()
    await asyncio.sleep(1.5)
    results[name] = {
        "calls": calls,
        "calls_per_second": round(calls / wall),
        "server_commits_per_call": round((server_commits(url) - before - 1) / calls, 3),
        "engine_commits_per_call": round(counts["commits"] / calls, 3),
        "statements_per_call": round(counts["statements"] / calls, 3),
        "cpu_ms_per_call": round(cpu * 1000 / calls, 3),
    }
    progress(f"{name}: {results[name]}")


def slack_message(number: int) -> ChannelMessage:
    return ChannelMessage(
        channel_type=ChannelType.SLACK,
        channel_id=f"D{number % 1000:04d}",
        message_id=f"Ev{number:08d}",
        user_identifier=f"T1:U{number % 1000:04d}",
        content=f"message number {number}, a sentence of ordinary length for a chat message",
        timestamp=T0,
        raw={"event_id": f"Ev{number:08d}", "event": {"type": "message", "text": "…"}},
    )


class InstantAdapter:
    channel_type = ChannelType.SLACK

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        await asyncio.sleep(0)
        return DeliveryReceipt(platform_message_id=f"p-{message.message_id}")


async def bench_inbox(url: str, args: argparse.Namespace, results: dict[str, Any]) -> None:
    database = Database(url, pool_size=args.pool_size)
    inbox = Inbox(database, GatewayMetrics(), clock=lambda: T0, on_accept=lambda _key: None)
    if args.max_batch:
        inbox._arrivals.max_batch = args.max_batch
    await inbox.accept(slack_message(-1))  # connections and compiled statements warm

    async def accept(number: int) -> None:
        await inbox.accept(slack_message(number))

    async with measured("inbox", url, database, args.calls, results):
        await closed_loop(args.callers, args.calls, accept)
    await database.dispose()


async def bench_outbox(url: str, args: argparse.Namespace, results: dict[str, Any]) -> None:
    database = Database(url, pool_size=args.pool_size)
    ids = []
    async with database.session() as db:
        outbox = OutboxRepository(db)
        for number in range(args.calls):
            row = await outbox.enqueue(
                message_id=f"out-{number}",
                channel_type="slack",
                channel_id="C1",
                content="reply",
                at=T0,
                claimed_until=T0 + timedelta(minutes=5),
            )
            ids.append(row)
    sender = OutboxSender(
        database,
        {ChannelType.SLACK: InstantAdapter()},
        GatewayMetrics(),
        clock=lambda: T0,
        concurrency=args.callers,
    )
    if args.max_batch:
        sender._marks.max_batch = args.max_batch

    async def send(number: int) -> None:
        await sender._send(ids[number])

    async with measured("outbox_marks", url, database, args.calls, results):
        await closed_loop(args.callers, args.calls, send)
    await database.dispose()


async def bench_locks(url: str, args: argparse.Namespace, results: dict[str, Any]) -> None:
    database = Database(url, pool_size=args.pool_size)
    locks = PostgresTurnLocks(database)
    if args.max_batch:
        locks._calls.max_batch = args.max_batch

    async def hold(number: int) -> None:
        async with locks.hold(f"user:{number % 5000}"):
            await asyncio.sleep(0)

    async with measured("lock_holds", url, database, args.calls, results):
        await closed_loop(args.callers, args.calls, hold)
        await locks.close()  # the lock connection's backend reports its commits as it exits
    await database.dispose()


async def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "callers": args.callers,
        "max_batch": args.max_batch or "default",
        "log_level": args.log_level,
    }
    database = Database(url)
    await database.upgrade()
    await database.dispose()
    await bench_inbox(url, args, results)
    await bench_outbox(url, args, results)
    await bench_locks(url, args, results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", default=DEFAULT_URL, help="admin URL (a database is made)")
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--max-batch", type=int, default=0, help="0: the code's own")
    parser.add_argument("--log-level", default="info", help="gateway log level (JSON to null)")
    args = parser.parse_args()
    # Production logging (JSON lines), written to nowhere: its CPU is part of the figures.
    real_stderr, sys.stderr = sys.stderr, open(os.devnull, "w")  # noqa: SIM115
    configure_logging("json", args.log_level)
    sys.stderr = real_stderr
    logging_stream = open(os.devnull, "w")  # noqa: SIM115
    try:
        with throwaway_database(libpq(args.postgres)) as name:
            url = make_url(args.postgres).set(database=name).render_as_string(hide_password=False)
            sys.stderr = logging_stream
            try:
                results = asyncio.run(run(url, args))
            finally:
                sys.stderr = real_stderr
    except BenchError as exc:
        sys.exit(f"bench: {exc}")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
