"""End-to-end load on the Slack channel: signed DM events in, `chat.postMessage` out.

Everything runs as its own process on loopback: the gateway (`python -m gateway run`, a
throwaway PostgreSQL database, transcripts in S3 on moto in server mode), a fake Slack Web API
(`python -m tests.fakes.slack_api`) and a fake Anthropic Messages API answering after
`--llm-latency` seconds (`python -m tests.fakes.anthropic_api`). This program is the load
generator: it sends signed `message.im` events for `--users` users (round-robin), either in a
closed loop (`--concurrency` messages in flight end to end: a worker sends its next event once
the reply to the previous one was posted) or at a fixed `--rate` (open loop: latencies count
from the moment a message was due, so a gateway that falls behind cannot hide its queue).

Each event carries a unique token in its text; the fake model's answer repeats the user's text,
so each post the fake Slack API receives is matched to its event. Per message:

- `ack_ms`: until the HTTP response of `POST /slack/events`;
- `e2e_ms`: event sent (or due) → `chat.postMessage` received by the fake Slack API (the wall
  clocks of two processes on one machine);
- `overhead_ms`: `e2e_ms` minus the model's configured latency (one model call per turn; the
  topic refresh every few messages runs after the reply was committed).

One JSON object goes to stdout, progress to stderr: `sustained_msgs_per_s` (measured messages
answered ÷ first send → last post), those latencies (p50/p90/p99/max), the gateway's
`cpu_s_per_1000_msgs` (from /proc, load start → last post; split into the event loop's thread
and the others: boto3 runs in worker threads), `gateway_peak_rss_mb` (VmHWM), `memory` (RSS
against the sessions in the database, sampled every second: what a new, then idle, session
costs), `backlog` (messages due minus answered; in open loop `growing` when its slope over the
second half of the schedule exceeds 2 % of the rate), `errors`, `duplicates` (extra posts for
one event) and `lost` (acknowledged, never answered, and not queued in the gateway's inbox or
outbox either: when `--timeout` ends a run before the gateway caught up, what is still queued
durably is reported under `correctness`, not as lost); the database's own single-row
INSERT+COMMIT rate on one connection (`pgbench`, else a psycopg loop, in a database of its own
before and after the load) and the ratio of the gateway's messages/s to it, so that runs on
machines of other speeds, or busy with other work, stay comparable; every process's CPU
during the load, in % of a core and in CPU-ms a message (`cpu_ms_per_message_during_load`:
the harness's processes too, so the machine's ceiling is their sum), and PostgreSQL's work per
message.

`--gateways N` runs N gateway processes on the one database, each on a port of its own with the
same config otherwise (the first migrates the database and writes the users; the others start
once it answers). The generator sends the events to them in turn, as a load balancer without
session affinity would, and moves the turn on by one at each pass over the users, so that every
user's messages reach every gateway even when `--users` is a multiple of N. The gateway figures
above are then those of all the processes together: CPU and log lines summed, the RSS in
`memory` summed, `gateway_peak_rss_mb` the largest, `gateway_exit_code` the first that is not 0;
`per_gateway` lists each process's events, CPU, peak RSS, exit code and log lines. The fake
Slack API receives the posts of all of them, so that `lost` and `duplicates` cover the lot.

    .venv/bin/python bench/e2e.py --messages 3000                     # closed loop, 0 ms LLM
    .venv/bin/python bench/e2e.py --messages 1200 --rate 20
    .venv/bin/python bench/e2e.py --users 10000 --llm-latency 2 --rate 20 --messages 1200 \\
        --set sessions.max_concurrent_turns=1000
    .venv/bin/python bench/e2e.py --messages 2000 --profile /tmp/gateway.json
    .venv/bin/python bench/e2e.py --messages 600 --logs /tmp/logs --set logging.level=info
    .venv/bin/python bench/e2e.py --users 200 --messages 600 --warmup 100 --gateways 2

`--profile` attaches py-spy (a dev dependency) to the gateway (the first one) for the run
(warm-up included) and writes speedscope JSON; without py-spy it runs that gateway under
cProfile (about half as fast) and adds its top functions to the JSON. `--logs DIR` copies
every process's log there. Exit code 1 when a message was lost or answered twice, 2 when the
benchmark could not run.

This module starts and stops the processes; the rest is in `e2e_settings` (the command line),
`e2e_gateways` (the gateway processes), `e2e_load` (the load generator and the posts watcher),
`e2e_samples` (CPU, RSS and sessions sampled during the load), `e2e_database` (what it asks
PostgreSQL) and `e2e_report` (the measured run and its figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from benchkit import progress, run_and_print_json, throwaway_database
from e2e_gateways import (
    first_failure,
    gateway_overrides,
    start_gateways,
    stop_gateways,
    write_gateway_configs,
)
from e2e_report import goals, run_load
from e2e_samples import together
from e2e_settings import BenchSettings, parse_settings
from processes import create_bucket, moto_server, run_service, use_fake_aws_credentials
from profiling import profile_top, py_spy, py_spy_attached
from routing import GatewayProcess, database_url, database_work, free_port, read_database_counters


def run(settings: BenchSettings) -> dict[str, Any]:
    """Start the processes in order, run the load, stop them in reverse order."""
    use_fake_aws_credentials()
    under_py_spy = settings.profile is not None and py_spy() is not None
    if settings.profile is not None and not under_py_spy:
        progress("py-spy is not installed (nor pyinstrument): profiling with cProfile")
    with (
        tempfile.TemporaryDirectory(prefix="gateway-e2e-") as folder,
        throwaway_database(settings.admin_url, keep=settings.keep) as database,
        throwaway_database(settings.admin_url) as probe_database,
    ):
        workdir = Path(folder)
        python = sys.executable
        slack_port, anthropic_port = free_port(), free_port()
        with (
            moto_server(workdir) as s3,
            run_service(
                "fake-slack",
                [python, "-m", "tests.fakes.slack_api", "--port", str(slack_port)],
                port=slack_port,
                workdir=workdir,
            ) as slack,
            run_service(
                "fake-anthropic",
                [
                    *(python, "-m", "tests.fakes.anthropic_api"),
                    *("--port", str(anthropic_port), "--latency", str(settings.llm_latency)),
                ],
                port=anthropic_port,
                workdir=workdir,
            ) as anthropic,
        ):
            create_bucket(s3.url)
            overrides = gateway_overrides(
                settings, slack_url=slack.url, anthropic_url=anthropic.url, s3_url=s3.url
            )
            configs = write_gateway_configs(
                workdir,
                count=settings.gateways,
                database_url=database_url(settings.admin_url, database, driver="psycopg"),
                overrides=overrides,
            )
            ports = ", ".join(str(port) for _, port, _ in configs)
            if settings.gateways == 1:
                progress(f"starting the gateway on port {ports} (database {database})")
            else:
                progress(f"starting {settings.gateways} gateways on ports {ports} ({database})")
            cprofile = settings.profile if settings.profile and not under_py_spy else None
            gateways: list[GatewayProcess] = []
            try:
                start_s, each_start_s = start_gateways(
                    configs, gateways, workdir=workdir, profile=cprofile, timeout=300.0
                )
                who = "the gateway" if settings.gateways == 1 else "every gateway"
                progress(f"{who} answered /healthz after {start_s:.1f}s")
                profiling: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
                if under_py_spy and settings.profile is not None:
                    profiling = py_spy_attached(gateways[0].process.pid, settings.profile)
                with profiling:
                    result, counters = asyncio.run(
                        run_load(settings, gateways, slack.url, database, probe_database)
                    )
            finally:
                exit_codes = stop_gateways(gateways)
                log_levels = [gateway.log_levels() for gateway in gateways]
                for (name, _, _), gateway, code, levels in zip(
                    configs, gateways, exit_codes, log_levels, strict=False
                ):
                    if code != 0 or {"error", "critical", "unparsed"} & levels.keys():
                        progress(f"{name} exit code {code}; its log ends:\n{gateway.tail()}")
                if settings.logs is not None:
                    settings.logs.mkdir(parents=True, exist_ok=True)
                    for log_file in workdir.glob("*.log"):
                        shutil.copy(log_file, settings.logs / log_file.name)
        time.sleep(0.5)  # the gateways' backends are still exiting
        after = read_database_counters(database_url(settings.admin_url, database))
    answered = max(settings.messages, 1)
    result["database_work_per_message"] = database_work(counters, after, messages=answered)
    result["goals"] = goals(settings, result)
    peak = together([gateway.final for gateway in gateways]).peak_rss_mb
    result["gateway_peak_rss_mb"] = None if peak is None else round(peak, 1)
    result["gateway_start_s"] = round(start_s, 1)
    result["gateway_exit_code"] = first_failure(exit_codes)
    all_lines = sum((Counter(levels) for levels in log_levels), Counter[str]())
    result["gateway_log_lines"] = dict(all_lines)
    result["errors"] += sum(all_lines[level] for level in ("error", "critical"))
    for entry, gateway, seconds, code, levels in zip(
        result["per_gateway"], gateways, each_start_s, exit_codes, log_levels, strict=True
    ):
        peak = gateway.final.peak_rss_mb
        entry["peak_rss_mb"] = None if peak is None else round(peak, 1)
        entry["start_s"] = round(seconds, 1)
        entry["exit_code"] = code
        entry["log_lines"] = levels
    if cprofile is not None and cprofile.exists():
        result["profile"] = {"tool": "cProfile (whole process)", **profile_top(cprofile)}
    elif under_py_spy:
        result["profile"] = {"tool": "py-spy (the whole run)", "output": str(settings.profile)}
    return result


def _interrupt_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: processes stopped, database dropped


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    settings = parse_settings(argv)
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    return run_and_print_json(
        lambda: run(settings), lambda result: 1 if result["lost"] or result["duplicates"] else 0
    )


if __name__ == "__main__":
    sys.exit(main())
