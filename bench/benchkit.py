"""What the benchmarks share: their error, progress lines, and a throwaway PostgreSQL database."""

from __future__ import annotations

import contextlib
import secrets
import sys
from collections.abc import Iterator

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
