"""Live replies (answers shown while they are written) on Slack, Teams and the web, measured
against issue 17's goals with a gateway process and fake platforms.

The gateway (`python -m gateway run`, PostgreSQL or SQLite) uses the anthropic provider pointed
at the fake Messages API (`llm.base_url`), which streams every answer `--words` words long, one
word every `--token-interval`. The fake Slack Web API (Slack's per-minute tiers enforced: 429s
counted), the fake Bot Framework and the fake Messages API run in this process, each on a
thread of its own, and record when every call arrived and every word left
(`time.monotonic()`, one clock for all). `--streams` users per channel write at once (a wave;
`--waves` of them, each once the previous one's answers are finished), the channels one after
the other:

- Slack (`live_slack.py`), a DM thread per user and wave: first visible text after the
  model's first token (p95 ≤ 500 ms), the status after the Events API's 200 (p95 ≤ 300 ms),
  API calls per 100 ms of streaming per answer (mean ≤ 1), 429s (0);
- Teams (`live_teams.py`), personal chats: requests to one chat at least a second apart, no
  streaming update more than 120 s into a stream (`--teams-overrun` adds one answer long
  enough to reach Teams' two minutes; it takes about three);
- web (`live_web.py`), the event stream of `GET /web/v1/messages`: first visible text after
  the model's first token (p95 ≤ 500 ms), the status after the POST's 202 (p95 ≤ 300 ms).

Each also counts answers completed, lost and duplicated, and the calls per answer. One JSON
object goes to stdout (each figure with its `goal` and whether it was `met`), progress to
stderr.

    .venv/bin/python bench/live.py                        # 50 streams, 3 waves, PostgreSQL
    .venv/bin/python bench/live.py --quick --database sqlite
    .venv/bin/python bench/live.py --channels slack --waves 5 --words 200
    .venv/bin/python bench/live.py --channels teams --streams 5 --waves 1 --teams-overrun

Exit code 1 when a reply was lost or duplicated, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from benchkit import (
    BenchError,
    add_config_overrides,
    config_overrides,
    progress,
    run_and_print_json,
    throwaway_database,
)
from live_overrun import overrun_figures, run_overrun
from live_slack import run_waves as run_slack_waves
from live_slack import slack_figures, slack_identities
from live_teams import bot_framework_thread, teams_config, teams_figures, teams_identities
from live_teams import run_waves as run_teams_waves
from live_web import run_waves as run_web_waves
from live_web import web_figures, web_identities
from routing import DEFAULT_ADMIN_URL, GatewayProcess, database_url, free_port, write_config

from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.fakes.bot_framework import FakeBotFramework
from tests.fakes.slack_api import SIGNING_SECRET, FakeSlackAPI

CHANNELS = ("slack", "teams", "web")


@dataclass(frozen=True, slots=True)
class LiveSettings:
    """The command line, validated."""

    streams: int
    waves: int
    token_interval: float
    words: int
    database: str
    admin_url: str
    channels: tuple[str, ...]
    teams_overrun: bool
    timeout: float
    logs: Path | None
    details: Path | None
    overrides: tuple[tuple[str, object], ...]


def seconds(text: str) -> float:
    """`30ms`, `0.03s` or `0.03` as seconds."""
    value = text.strip().lower()
    try:
        if value.endswith("ms"):
            return float(value[:-2]) / 1000
        return float(value.removesuffix("s"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (30ms, 0.03s)") from exc


def postgres_reachable(admin_url: str) -> bool:
    """Whether the admin URL connects (the default database is then PostgreSQL)."""
    try:
        with psycopg.connect(admin_url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def parse_settings(argv: Sequence[str] | None) -> LiveSettings:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=50, help="users per channel (50)")
    parser.add_argument("--waves", type=int, default=3, help="messages per user (3)")
    parser.add_argument(
        "--token-interval", type=seconds, default=0.03, help="the model's pace per word (30ms)"
    )
    parser.add_argument("--words", type=int, default=80, help="words per answer (80)")
    parser.add_argument(
        "--database",
        choices=("postgresql", "sqlite"),
        help="the gateway's database (postgresql when reachable, else sqlite)",
    )
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN_URL, help="PostgreSQL admin URL")
    parser.add_argument(
        "--channels", default=",".join(CHANNELS), help="which to measure (slack,teams,web)"
    )
    parser.add_argument(
        "--teams-overrun",
        action="store_true",
        help="also stream one Teams answer past two minutes (takes about three)",
    )
    parser.add_argument("--quick", action="store_true", help="10 streams, 1 wave")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per wave (120)")
    parser.add_argument("--logs", type=Path, help="copy the gateway's log into this folder")
    parser.add_argument(
        "--details", type=Path, help="write every answer's timeline here (JSON lines)"
    )
    add_config_overrides(parser, "logging.level=info")
    args = parser.parse_args(argv)
    channels = tuple(name.strip() for name in args.channels.split(",") if name.strip())
    if not channels or set(channels) - set(CHANNELS):
        parser.error(f"--channels: a comma-separated choice of {', '.join(CHANNELS)}")
    streams, waves = (10, 1) if args.quick else (args.streams, args.waves)
    if min(streams, waves, args.words) < 1 or args.token_interval < 0:
        parser.error("--streams, --waves and --words must be positive, --token-interval >= 0")
    database = args.database
    if database is None:
        database = "postgresql" if postgres_reachable(args.admin_url) else "sqlite"
    return LiveSettings(
        streams=streams,
        waves=waves,
        token_interval=args.token_interval,
        words=args.words,
        database=database,
        admin_url=args.admin_url,
        channels=channels,
        teams_overrun=args.teams_overrun,
        timeout=args.timeout,
        logs=args.logs,
        details=args.details,
        overrides=tuple(config_overrides(parser, args.set)),
    )


@contextlib.contextmanager
def gateway_database(settings: LiveSettings, workdir: Path) -> Iterator[str]:
    """The gateway's SQLAlchemy URL: a throwaway PostgreSQL database, or a SQLite file."""
    if settings.database == "sqlite":
        yield f"sqlite+aiosqlite:///{workdir / 'gateway.db'}"
        return
    with throwaway_database(settings.admin_url) as name:
        yield database_url(settings.admin_url, name, driver="psycopg")


def gateway_overrides(
    settings: LiveSettings, slack: FakeSlackAPI, teams: FakeBotFramework, model: FakeAnthropicAPI
) -> list[tuple[str, object]]:
    """Slack, Teams and the open web channel on the fakes, the model on the fake Messages API;
    then the `--set` overrides."""
    users = [
        *slack_identities(settings.streams),
        *teams_identities(settings.streams + 1),  # the last one: the overrun's chat
        *web_identities(settings.streams),
    ]
    return [
        ("logging.level", "warning"),
        (
            "channels.slack",
            {
                "enabled": True,
                "mode": "http",
                "bot_token": "xoxb-bench",
                "signing_secret": SIGNING_SECRET,
                "api_base_url": slack.url,
            },
        ),
        ("channels.teams", teams_config(teams)),
        ("identity.users", users),
        (
            "llm",
            {
                "provider": "anthropic",
                "api_key": "bench-not-a-key",
                "base_url": model.url,
                "max_retries": 2,
                "timeout": "300s",
            },
        ),
        *settings.overrides,
    ]


async def measure_channels(
    settings: LiveSettings,
    gateway: GatewayProcess,
    fakes: tuple[FakeSlackAPI, FakeBotFramework, FakeAnthropicAPI],
) -> dict[str, Any]:
    """Each chosen channel's waves, one channel after the other, and its figures."""
    slack, teams, model = fakes
    streams, waves, wait_s = settings.streams, settings.waves, settings.timeout
    result: dict[str, Any] = {}
    details: dict[str, list[dict[str, Any]]] = {}
    for channel in settings.channels:
        began = time.monotonic()
        if channel == "slack":
            slack_answers = await run_slack_waves(
                gateway.base_url, slack, streams=streams, waves=waves, wait_s=wait_s
            )
            result["slack"], details["slack"] = slack_figures(slack, model, slack_answers)
        elif channel == "teams":
            teams_answers = await run_teams_waves(
                gateway.base_url, teams, streams=streams, waves=waves, wait_s=wait_s
            )
            result["teams"] = teams_figures(teams, model, teams_answers)
        else:
            web_answers, feeds = await run_web_waves(
                gateway.base_url, streams=streams, waves=waves, wait_s=wait_s
            )
            result["web"], details["web"] = web_figures(model, web_answers, feeds)
        result[channel]["seconds"] = round(time.monotonic() - began, 1)
    if settings.teams_overrun:
        answer = await run_overrun(gateway.base_url, teams, model, user=settings.streams)
        result["teams_overrun"] = overrun_figures(teams, answer)
    if settings.details is not None:
        write_details(settings.details, details)
    return result


def write_details(path: Path, details: dict[str, list[dict[str, Any]]]) -> None:
    """Every answer's record as JSON lines (`channel` added), for a closer look."""
    with path.open("w", encoding="utf-8") as out:
        for channel, records in details.items():
            for record in records:
                out.write(json.dumps({"channel": channel, **record}) + "\n")
    progress(f"wrote every answer's record to {path}")


def measure(settings: LiveSettings) -> dict[str, Any]:
    """Start the fakes and the gateway, run the channels, stop everything; the figures."""
    with (
        FakeSlackAPI() as slack,
        FakeAnthropicAPI() as model,
        bot_framework_thread() as teams,
        tempfile.TemporaryDirectory(prefix="gateway-bench-") as folder,
        gateway_database(settings, Path(folder)) as url,
    ):
        slack.limit_tiers()
        model.token_interval = settings.token_interval
        model.answer_words = settings.words
        workdir, port = Path(folder), free_port()
        overrides = gateway_overrides(settings, slack, teams, model)
        config = write_config(workdir, port=port, database_url=url, users=[], overrides=overrides)
        progress(f"starting the gateway on port {port} ({settings.database})")
        gateway = GatewayProcess.start(config, port=port, workdir=workdir, profile=None)
        try:
            result = asyncio.run(measure_channels(settings, gateway, (slack, teams, model)))
        finally:
            exit_code = gateway.stop()
            levels = gateway.log_levels()
            warnings = logged_warnings(gateway.log_path)
            if settings.logs is not None:
                settings.logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(gateway.log_path, settings.logs / "gateway.log")
    return {
        "settings": {
            "streams": settings.streams,
            "waves": settings.waves,
            "token_interval_ms": round(settings.token_interval * 1000, 1),
            "words": settings.words,
            "database": settings.database,
        },
        **result,
        "gateway_cpu_s": gateway.final.cpu_s,
        "bench_cpu_s": round(own_cpu_s(), 1),
        "gateway_exit_code": exit_code,
        "gateway_log_lines": levels,
        "gateway_warnings": warnings,
        "goals_met": goals_met(result),
    }


def logged_warnings(log_path: Path) -> dict[str, int]:
    """The gateway's warnings and errors by event name (a rate-limited final shows as
    `outbox.retry_scheduled`)."""
    events: Counter[str] = Counter()
    with contextlib.suppress(OSError), log_path.open(encoding="utf-8", errors="replace") as log:
        for line in log:
            with contextlib.suppress(json.JSONDecodeError, AttributeError):
                entry = json.loads(line)
                if entry.get("level") in ("warning", "error", "critical"):
                    events[str(entry.get("event"))] += 1
    return dict(events.most_common())


def own_cpu_s() -> float:
    """This process's CPU seconds (the fakes and the clients), user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def goals_met(result: dict[str, Any]) -> bool:
    """Whether every figure with a goal met it."""
    return all(
        figure.get("met", True)
        for section in result.values()
        if isinstance(section, dict)
        for figure in section.values()
        if isinstance(figure, dict)
    )


def verdict(result: dict[str, Any]) -> int:
    """1 when a reply was lost or duplicated in any channel, else 0."""
    sections = [value for value in result.values() if isinstance(value, dict)]
    failed = any(section.get("lost") or section.get("duplicates") for section in sections)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    settings = parse_settings(argv)
    return run_and_print_json(lambda: measure(settings), verdict, could_not_run=(BenchError,))


if __name__ == "__main__":
    sys.exit(main())
