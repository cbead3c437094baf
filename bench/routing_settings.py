"""The command line of `routing.py`, validated into `BenchSettings`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchkit import add_config_overrides, config_overrides

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """The command line, validated."""

    messages: int
    users: int
    concurrency: int
    rate: float | None
    warmup: int
    timeout: float
    admin_url: str
    keep: bool
    profile: Path | None
    overrides: tuple[tuple[str, object], ...]  # (dotted config key, value) from --set


def parse_settings(argv: Sequence[str] | None) -> BenchSettings:
    """The command line."""
    parser = argparse.ArgumentParser(
        description="Web-channel ingestion on PostgreSQL: accepted/s, ack latency, replies."
    )
    parser.add_argument("--messages", type=int, default=5000, help="measured messages (5000)")
    parser.add_argument("--users", type=int, default=100, help="users, round-robin (100)")
    parser.add_argument("--concurrency", type=int, default=64, help="POSTs in flight (64)")
    parser.add_argument("--rate", type=float, help="open loop at this many messages/s")
    parser.add_argument("--warmup", type=int, default=300, help="uncounted messages first (300)")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for the replies (600)"
    )
    parser.add_argument(
        "--database-url", default=DEFAULT_ADMIN_URL, help=f"admin URL ({DEFAULT_ADMIN_URL})"
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--profile", type=Path, help="run the gateway under cProfile into FILE")
    add_config_overrides(parser, "storage.pool_size=40")
    args = parser.parse_args(argv)
    overrides = config_overrides(parser, args.set)
    if min(args.messages, args.users, args.concurrency) < 1 or args.warmup < 0:
        parser.error("--messages, --users and --concurrency must be positive, --warmup >= 0")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    return BenchSettings(
        messages=args.messages,
        users=args.users,
        concurrency=args.concurrency,
        rate=args.rate,
        warmup=args.warmup,
        timeout=args.timeout,
        admin_url=args.database_url,
        keep=args.keep,
        profile=args.profile,
        overrides=tuple(overrides),
    )
