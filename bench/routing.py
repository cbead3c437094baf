"""Web-channel ingestion on PostgreSQL with the offline LLM: acceptance rate, ack latency and
end-to-end completion.

What it measures, on a gateway started as its own process against a throwaway database:

- `accepted_per_s`: HTTP 202 answers of `POST /web/v1/messages` per second under load, either
  closed loop (`--concurrency` POSTs in flight) or open loop (`--rate` messages per second,
  at most `--concurrency` in flight);
- `ack_ms`: time from sending the POST to receiving its 202 (p50/p90/p99/max). In open-loop
  mode it counts from the moment the message was due, so a gateway that falls behind cannot
  hide its queue (coordinated omission); `send_delay_ms_max` is the longest a due message
  waited for the generator or a free connection;
- `completion_s` and `replies_per_s`: from the first POST until every accepted message has a
  reply in `GET /web/v1/messages?user=U&after=CURSOR`. The feeds are read once the sending
  stops, and sparingly (see `FeedFollower.wait_for`), since reading them takes CPU from the
  gateway being measured; `replies_committed_at_load_end` (turns finished by then, from
  `/metrics`) shows how far behind the replies were;
- correctness, over every accepted message (warm-up included), from a final full read of each
  user's feed: `lost` (no reply before `--timeout`), `duplicates` (extra replies), `misrouted`
  (a reply in another user's feed), `unexpected_replies` (replies to nothing sent here),
  `replied_after_error` (replies to POSTs that failed: stored, but not acknowledged) and
  `skipped_by_cursor` (replies the incremental cursor never returned);
- CPU during the load, in % of one core: the machine's, the gateway's (/proc/PID/stat), this
  program's and the other processes' (PostgreSQL, anything else running), since they all
  share the cores, and what could not be attributed; the gateway's peak RSS (VmHWM);
- `database_work_per_message`: PostgreSQL's statistics for the benchmark's database (sessions
  opened, commits, rows fetched, time spent executing statements, and scans and rows read and
  written by table) from the start of the load until the gateway stopped, divided by the
  accepted messages.

Run it (PostgreSQL on 127.0.0.1:5432, trust auth; it creates and drops `gateway_bench_*`):

    .venv/bin/python bench/routing.py --messages 5000 --users 100
    .venv/bin/python bench/routing.py --messages 2000 --rate 500
    .venv/bin/python bench/routing.py --messages 2000 --profile /tmp/gateway.prof
    .venv/bin/python bench/routing.py --messages 2000 --set storage.pool_size=40

One JSON object goes to stdout, progress to stderr. The exit code is 1 when a message was lost,
answered twice or answered to the wrong user, 2 when the benchmark could not run.

The pieces: `routing_settings` (the command line), `routing_gateway` (its config and process),
`routing_database` (PostgreSQL's statistics), `routing_cpu` (/proc), `routing_http` (the
connections, the POSTs and the feeds), `routing_replies` (waiting for the replies, the audit)
and `routing_run` (one measured run and its figures).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import httpx
from benchkit import BenchError, progress, throwaway_database
from routing_cpu import (
    CpuSnapshot,
    ProcessSample,
    cpu_by_process,
    cpu_report,
    read_machine_ticks,
    read_process,
)
from routing_database import database_url, database_work, read_database_counters
from routing_gateway import PROJECT_ROOT, GatewayProcess, free_port, user_ids, write_config
from routing_run import percentiles_ms, run_load
from routing_settings import DEFAULT_ADMIN_URL, parse_settings

# The other benchmarks (e2e*, slack_ack, processes, profiling) take these from here.
__all__ = [
    "DEFAULT_ADMIN_URL",
    "PROJECT_ROOT",
    "CpuSnapshot",
    "GatewayProcess",
    "ProcessSample",
    "cpu_by_process",
    "cpu_report",
    "database_url",
    "database_work",
    "free_port",
    "main",
    "percentiles_ms",
    "read_database_counters",
    "read_machine_ticks",
    "read_process",
    "write_config",
]


def _interrupt_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the gateway is stopped, the database dropped


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    settings = parse_settings(argv)
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    users = user_ids(settings.users)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="gateway-bench-") as folder,
            throwaway_database(settings.admin_url, keep=settings.keep) as database,
        ):
            workdir = Path(folder)
            port = free_port()
            config = write_config(
                workdir,
                port=port,
                database_url=database_url(settings.admin_url, database, driver="psycopg"),
                users=users,
                overrides=settings.overrides,
            )
            progress(f"starting the gateway on port {port} (database {database})")
            gateway = GatewayProcess.start(
                config, port=port, workdir=workdir, profile=settings.profile
            )
            try:
                result, counters = asyncio.run(run_load(settings, gateway, users, database))
            finally:
                exit_code = gateway.stop()
                log_levels = gateway.log_levels()
                if exit_code != 0 or {"error", "critical", "unparsed"} & log_levels.keys():
                    progress(f"gateway exit code {exit_code}; its log ends:\n{gateway.tail()}")
            time.sleep(0.5)  # the gateway's backends are still exiting
            after = read_database_counters(database_url(settings.admin_url, database))
            result["database_work_per_message"] = database_work(
                counters, after, messages=max(result["accepted"], 1)
            )
    except BenchError as exc:
        progress(str(exc))
        return 2
    except httpx.HTTPError as exc:
        progress(f"the gateway stopped answering: {exc!r}")
        return 2
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    peak_rss_mb = gateway.final.peak_rss_mb
    result["gateway_peak_rss_mb"] = None if peak_rss_mb is None else round(peak_rss_mb, 1)
    result["gateway_cpu_s_total"] = gateway.final.cpu_s
    result["gateway_exit_code"] = exit_code
    result["gateway_log_lines"] = log_levels
    print(json.dumps(result, indent=2))
    return 1 if result["lost"] or result["duplicates"] or result["misrouted"] else 0


if __name__ == "__main__":
    sys.exit(main())
