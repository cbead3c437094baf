"""`bench/context.py`'s command line: its settings (`BenchSettings`) and their parsing."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_SIZES = (100, 10_000, 100_000)
BACKENDS = ("sqlite", "postgres")
DEFAULT_HISTORY_TURNS = 100_000


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """The command line, validated."""

    sizes: tuple[int, ...]
    history_turns: int
    neighbour_turns: int
    runs: int
    warmup: int
    backends: tuple[str, ...]
    admin_url: str


def parse_settings(argv: Sequence[str] | None) -> BenchSettings:
    """The command line."""
    parser = argparse.ArgumentParser(
        description="Context-assembly time for sessions of growing length, SQLite and PostgreSQL."
    )
    parser.add_argument(
        "--sizes",
        default=",".join(str(size) for size in DEFAULT_SIZES),
        help="session lengths in messages, comma-separated (100,10000,100000; '' for none)",
    )
    parser.add_argument(
        "--history-turns",
        type=int,
        default=DEFAULT_HISTORY_TURNS,
        help=f"indexed turns of the user with a long history ({DEFAULT_HISTORY_TURNS}; 0: none)",
    )
    parser.add_argument(
        "--neighbour-turns",
        type=int,
        default=0,
        help="other users' turns written after the long history, before its user's recent "
        "sessions (0)",
    )
    parser.add_argument("--runs", type=int, default=50, help="measured calls per case (50)")
    parser.add_argument("--warmup", type=int, default=5, help="uncounted calls per case first (5)")
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help="sqlite and/or postgres (both)"
    )
    parser.add_argument(
        "--database-url",
        default=DEFAULT_ADMIN_URL,
        help=f"PostgreSQL admin URL ({DEFAULT_ADMIN_URL})",
    )
    args = parser.parse_args(argv)
    try:
        sizes = tuple(sorted({int(size) for size in args.sizes.split(",") if size.strip()}))
    except ValueError:
        parser.error(f"--sizes {args.sizes}: expected numbers separated by commas")
    if sizes and min(sizes) < 2:
        parser.error("--sizes: session lengths are 2 messages or more")
    if args.history_turns < 0 or args.neighbour_turns < 0:
        parser.error("--history-turns and --neighbour-turns must be 0 or more")
    if not sizes and not args.history_turns:
        parser.error("nothing to measure: give --sizes or --history-turns")
    backends = tuple(name.strip() for name in args.backends.split(",") if name.strip())
    unknown = set(backends) - set(BACKENDS)
    if not backends or unknown:
        parser.error(f"--backends: choose from {', '.join(BACKENDS)}")
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be positive and --warmup >= 0")
    return BenchSettings(
        sizes=sizes,
        history_turns=args.history_turns,
        neighbour_turns=args.neighbour_turns,
        runs=args.runs,
        warmup=args.warmup,
        backends=backends,
        admin_url=args.database_url,
    )
