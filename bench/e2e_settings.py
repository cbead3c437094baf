"""The command line of `e2e.py`, parsed into frozen settings."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchkit import add_config_overrides, config_overrides
from routing import DEFAULT_ADMIN_URL


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """The command line, validated."""

    users: int
    gateways: int
    rate: float | None
    concurrency: int
    messages: int
    llm_latency: float
    warmup: int
    timeout: float
    admin_url: str
    keep: bool
    profile: Path | None
    logs: Path | None
    db_probe_seconds: float
    overrides: tuple[tuple[str, object], ...]


def parse_settings(argv: Sequence[str] | None) -> BenchSettings:
    """The command line."""
    parser = argparse.ArgumentParser(
        description="Slack DM events end to end: msgs/s, ack, overhead, CPU, memory, losses."
    )
    parser.add_argument("--users", type=int, default=1000, help="users, round-robin (1000)")
    parser.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="gateway processes on the one database, sent the events in turn (1)",
    )
    parser.add_argument("--rate", type=float, help="messages/s, open loop (default: closed loop)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="closed loop: messages in flight end to end; open loop: requests in flight (64)",
    )
    parser.add_argument("--messages", type=int, default=5000, help="measured messages (5000)")
    parser.add_argument(
        "--llm-latency", type=float, default=0.0, help="seconds the fake model takes (0)"
    )
    parser.add_argument("--warmup", type=int, default=200, help="uncounted messages first (200)")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for the replies (120)"
    )
    parser.add_argument(
        "--db-probe-seconds", type=float, default=5.0, help="each database probe's length (5)"
    )
    parser.add_argument("--database-url", default=DEFAULT_ADMIN_URL, help="admin URL")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--profile", type=Path, help="profile the gateway into FILE")
    parser.add_argument("--logs", type=Path, help="copy every process's log into DIR")
    add_config_overrides(parser, "sessions.max_concurrent_turns=200")
    args = parser.parse_args(argv)
    overrides = config_overrides(parser, args.set)
    if min(args.users, args.gateways, args.concurrency, args.messages) < 1 or args.warmup < 0:
        parser.error(
            "--users, --gateways, --concurrency and --messages must be positive, --warmup >= 0"
        )
    if args.users > 100_000:
        parser.error("--users: at most 100000 (Slack ids are U00000…U99999)")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    if args.llm_latency < 0 or not math.isfinite(args.llm_latency):
        parser.error("--llm-latency must be a number of seconds >= 0")
    return BenchSettings(
        users=args.users,
        gateways=args.gateways,
        rate=args.rate,
        concurrency=args.concurrency,
        messages=args.messages,
        llm_latency=args.llm_latency,
        warmup=args.warmup,
        timeout=args.timeout,
        admin_url=args.database_url,
        keep=args.keep,
        profile=args.profile,
        logs=args.logs,
        db_probe_seconds=args.db_probe_seconds,
        overrides=tuple(overrides),
    )
