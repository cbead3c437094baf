"""What the benchmarks share: their error, progress lines, a throwaway PostgreSQL database, and
the JSON they print."""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import sql


class BenchError(Exception):
    """The benchmark could not run (database, gateway start-up); the message says why."""


def progress(text: str) -> None:
    """One line of progress on stderr."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def throwaway_database(admin_url: str, *, keep: bool = False) -> Iterator[str]:
    """Create `gateway_bench_<random>` and drop it afterwards (also on errors and Ctrl-C)."""
    name = f"gateway_bench_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise BenchError(f"cannot create a database with {admin_url}: {exc}") from exc
    try:
        yield name
    finally:
        if keep:
            progress(f"kept database {name}")
        else:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(drop)
            progress(f"dropped database {name}")


def run_and_print_json(
    measure: Callable[[], dict[str, Any]],
    verdict: Callable[[dict[str, Any]], int],
    *,
    could_not_run: tuple[type[Exception], ...] = (BenchError,),
) -> int:
    """Run `measure` and print its figures as JSON, the only thing on stdout. The exit code is
    `verdict(figures)`, 2 when the benchmark could not run (one of `could_not_run`, its message
    on stderr), 130 when interrupted."""
    try:
        result = measure()
    except could_not_run as exc:
        progress(str(exc))
        return 2
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    print(json.dumps(result, indent=2))
    return verdict(result)
