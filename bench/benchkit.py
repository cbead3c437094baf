"""What the benchmarks share: their error, progress lines, a throwaway PostgreSQL database, and
the JSON they print."""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import yaml
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


def add_config_overrides(parser: argparse.ArgumentParser, example: str) -> None:
    """`--set KEY=VALUE` (repeatable): a gateway config key to override, VALUE read as YAML."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a gateway config key, e.g. {example} (VALUE is YAML)",
    )


def config_overrides(parser: argparse.ArgumentParser, items: list[str]) -> list[tuple[str, Any]]:
    """The `--set` items as (dotted key, value) pairs; a malformed one is a usage error."""
    overrides = []
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            parser.error(f"--set {item}: expected KEY=VALUE")
        overrides.append((key, yaml.safe_load(value)))
    return overrides
