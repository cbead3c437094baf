"""What `e2e.py` asks PostgreSQL directly: the database's own single-row INSERT+COMMIT pace
(in a database of its own), the server's WAL flushes, where unanswered events are in the
gateway's inbox and outbox, and how many sessions the gateway created."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence

import psycopg
from benchkit import progress

PROBE_TABLE = "bench_insert_probe"


def database_insert_rate(url: str, seconds: float) -> tuple[float, str]:
    """Single-row INSERT+COMMIT per second on one connection, and how it was measured.

    `url` is a database of its own on the same server: the probe's commits must not count in
    the gateway database's statistics.
    """
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {PROBE_TABLE} "
            "(id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), note text)"
        )
    pgbench = shutil.which("pgbench")
    if pgbench is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".sql", encoding="utf-8") as script:
            script.write(f"INSERT INTO {PROBE_TABLE} (note) VALUES ('probe');\n")
            script.flush()
            command = [pgbench, "-n", "-c", "1", "-T", str(max(round(seconds), 1))]
            done = subprocess.run(
                [*command, "-f", script.name, url], capture_output=True, text=True, check=False
            )
        found = re.search(r"tps = ([\d.]+)", done.stdout)
        if done.returncode == 0 and found:
            return float(found.group(1)), "pgbench -c 1, one INSERT per transaction"
        progress(f"pgbench failed ({done.returncode}): {done.stderr.strip()[:300]}")
    count = 0
    with psycopg.connect(url) as connection:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            connection.execute(f"INSERT INTO {PROBE_TABLE} (note) VALUES ('probe')")
            connection.commit()
            count += 1
        elapsed = time.perf_counter() - started
    return count / elapsed, "psycopg, one connection, INSERT then COMMIT"


UNANSWERED_QUERY = """
    SELECT wanted.message_id, coalesce(i.status, 'none'), coalesce(o.status, 'none')
    FROM unnest(%s::text[]) AS wanted(message_id)
    LEFT JOIN inbound_events i ON i.channel_type = 'slack' AND i.message_id = wanted.message_id
    LEFT JOIN outbound_messages o ON o.inbound_event_id = i.id
"""


def event_states(url: str, tokens: Sequence[str]) -> dict[str, str]:
    """Where these events are in the gateway's database, by token: `inbox/outbox` status
    (`none/none`: the inbox never stored the event)."""
    if not tokens:
        return {}
    with psycopg.connect(url) as connection:
        rows = connection.execute(UNANSWERED_QUERY, ([f"Ev{token}" for token in tokens],))
        return {
            message_id.removeprefix("Ev"): f"{inbox}/{outbox}" for message_id, inbox, outbox in rows
        }


def is_queued(state: str) -> bool:
    """Waiting durably: pending in the inbox, or its reply pending (or being sent) in the outbox."""
    return state.startswith("pending/") or state.endswith(("/pending", "/sending"))


def count_sessions(url: str) -> int | None:
    """How many sessions the gateway created."""
    with contextlib.suppress(psycopg.Error), psycopg.connect(url) as connection:
        row = connection.execute("SELECT count(*) FROM sessions").fetchone()
        return int(row[0]) if row else None
    return None


def wal_counters(url: str) -> tuple[int, int] | None:
    """The server's WAL flushes (`pg_stat_wal.wal_sync`) and bytes so far; None before
    PostgreSQL 14, which has no such view.

    `pg_stat_database.xact_commit` counts every transaction, a one-statement read in
    autocommit too, though only a transaction that wrote waits for its WAL to reach the disk:
    the flushes are what a message costs of the server's commit budget (what `pgbench -c 1`
    measures). They are the whole server's: the WAL writer's own flushes (a few a second) are
    in them, and nothing else may write meanwhile.
    """
    with psycopg.connect(url, autocommit=True) as connection:
        try:
            row = connection.execute("SELECT wal_sync, wal_bytes FROM pg_stat_wal").fetchone()
        except psycopg.errors.UndefinedTable:
            return None
    return None if row is None else (int(row[0]), int(row[1]))
