"""The benchmark's database as PostgreSQL counts it: its cumulative statistics, read before
the load and after the gateway stopped, give `database_work_per_message`; and the database's
URL for each client (psycopg, SQLAlchemy)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

DATABASE_QUERY = """
    SELECT sessions, xact_commit, xact_rollback, tup_fetched, active_time
    FROM pg_stat_database WHERE datname = current_database()
"""
TABLES_QUERY = """
    SELECT relname, seq_scan + coalesce(idx_scan, 0),
           seq_tup_read + coalesce(idx_tup_fetch, 0), n_tup_ins + n_tup_upd + n_tup_del
    FROM pg_stat_user_tables
"""


def read_database_counters(url: str) -> dict[str, float]:
    """PostgreSQL's cumulative statistics of the database at `url`, flattened.

    Backends report their statistics with a delay (up to 10 s when idle), but always when
    their connection ends: the figures are complete only once the gateway closed its pool.
    """
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(DATABASE_QUERY).fetchone() or (0, 0, 0, 0, 0)
        tables = connection.execute(TABLES_QUERY).fetchall()
    names = ("sessions_opened", "commits", "rollbacks", "rows_fetched", "active_ms")
    counters = {name: float(value) for name, value in zip(names, row, strict=True)}
    for table, scans, rows_read, rows_written in tables:
        counters[f"{table}.scans"] = float(scans)
        counters[f"{table}.rows_read"] = float(rows_read)
        counters[f"{table}.rows_written"] = float(rows_written)
    return counters


def database_work(
    before: dict[str, float], after: dict[str, float], *, messages: int
) -> dict[str, Any]:
    """The database's work between two readings, per message; the busiest tables by scans."""
    per_message = {
        name: round((value - before.get(name, 0.0)) / messages, 2) for name, value in after.items()
    }
    work: dict[str, Any] = {name: value for name, value in per_message.items() if "." not in name}
    tables: dict[str, dict[str, float]] = {}
    for name, value in per_message.items():
        if "." in name:
            table, counter = name.split(".", 1)
            tables.setdefault(table, {})[counter] = value
    busiest = sorted(tables.items(), key=lambda item: -item[1].get("scans", 0.0))
    work["tables"] = {table: counters for table, counters in busiest if counters["scans"] >= 0.1}
    return work


def database_url(admin_url: str, database: str, *, driver: str = "") -> str:
    """The admin URL pointed at `database` (with `+driver` for SQLAlchemy)."""
    parts = urlsplit(admin_url)
    scheme = f"postgresql+{driver}" if driver else "postgresql"
    return urlunsplit(parts._replace(scheme=scheme, path=f"/{database}"))
