"""The gateways of `e2e.py` as processes: their configs (`--gateways N`: one port each, the
same otherwise), their start in order (the first migrates the database), their turn workers
(`server.turn_workers`: the children that count as part of them), and their stop."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from e2e_settings import BenchSettings
from processes import BUCKET, REGION, spawn_logged
from routing import GatewayProcess, free_port, write_config
from slack_ack import slack_overrides


def gateway_names(count: int) -> list[str]:
    """What the gateways' logs and folders are called: `gateway` alone, else `gateway-1`…"""
    return ["gateway"] if count == 1 else [f"gateway-{number}" for number in range(1, count + 1)]


def launch_gateway(
    config: Path, *, name: str, port: int, workdir: Path, profile: Path | None
) -> GatewayProcess:
    """`python -m gateway run` (under cProfile when `profile`) in the config's folder, its
    stdout and stderr in `workdir/NAME.log`; not waited for."""
    command = [sys.executable]
    if profile is not None:
        command += ["-m", "cProfile", "-o", str(profile.resolve())]
    command += ["-m", "gateway", "run", "--config", str(config)]
    log_path = workdir / f"{name}.log"
    process = spawn_logged(command, cwd=config.parent, log_path=log_path)
    return GatewayProcess(process, f"http://127.0.0.1:{port}", log_path)


def start_gateways(
    configs: Sequence[tuple[str, int, Path]],
    started: list[GatewayProcess],
    *,
    workdir: Path,
    profile: Path | None,
    timeout: float,
) -> tuple[float, list[float]]:
    """Start a gateway per (name, port, config) and wait until each answers `/healthz`, with a
    longer wait than `GatewayProcess.start` (the start-up writes every configured user and
    identity: a minute or more for 10,000 users). The first starts alone: it migrates the
    database, which two processes must not do at once; the others start together once it
    answers. Each one is added to `started` as it is launched, for the caller to stop (also
    when one fails to start). The seconds until all answered, and each one's from its launch."""
    began = time.perf_counter()
    start_s = []
    for batch in (configs[:1], configs[1:]):
        launched = []
        for name, port, config in batch:
            gateway = launch_gateway(
                config, name=name, port=port, workdir=workdir, profile=None if started else profile
            )
            started.append(gateway)
            launched.append((gateway, time.perf_counter()))
        for gateway, launched_at in launched:
            gateway.wait_healthy(timeout=timeout)
            start_s.append(time.perf_counter() - launched_at)
    return time.perf_counter() - began, start_s


def write_gateway_configs(
    workdir: Path, *, count: int, database_url: str, overrides: Sequence[tuple[str, object]]
) -> list[tuple[str, int, Path]]:
    """The gateways' configs, the same but for the port, each in its own folder (`workdir`
    itself for a single gateway) that is also its working directory: (name, port, config)."""
    configs: list[tuple[str, int, Path]] = []
    for name in gateway_names(count):
        port = free_port()
        while port in {taken for _, taken, _ in configs}:
            port = free_port()
        folder = workdir if count == 1 else workdir / name
        folder.mkdir(exist_ok=True)
        config = write_config(
            folder, port=port, database_url=database_url, users=[], overrides=overrides
        )
        configs.append((name, port, config))
    return configs


def stop_gateways(gateways: Sequence[GatewayProcess]) -> list[int | None]:
    """Stop every gateway at once (`GatewayProcess.stop`: final figures, SIGTERM, wait); their
    exit codes."""
    if not gateways:
        return []
    with ThreadPoolExecutor(max_workers=len(gateways)) as pool:
        return list(pool.map(lambda gateway: gateway.stop(), gateways))


def first_failure(exit_codes: Sequence[int | None]) -> int | None:
    """The first exit code that is not 0 (None: killed after ignoring SIGTERM), else 0."""
    return next((code for code in exit_codes if code != 0), 0)


def gateway_overrides(
    settings: BenchSettings, *, slack_url: str, anthropic_url: str, s3_url: str
) -> list[tuple[str, object]]:
    """A Slack-only gateway on the fake APIs, transcripts in S3; then the `--set` overrides."""
    return [
        *slack_overrides(slack_url, settings.users),
        (
            "llm",
            {
                "provider": "anthropic",
                "api_key": "bench-not-a-key",
                "base_url": anthropic_url,
                "max_retries": 2,
            },
        ),
        (
            "storage.transcripts",
            {"backend": "s3", "s3": {"bucket": BUCKET, "endpoint_url": s3_url, "region": REGION}},
        ),
        *settings.overrides,
    ]


def turn_workers(parent: int) -> list[int]:
    """The pids of a gateway's turn workers: its children running `gateway run --role turns`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
            if int(stat.rsplit(")", 1)[1].split()[1]) != parent:
                continue
            if b"turns" in (entry / "cmdline").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found
