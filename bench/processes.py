"""Helper servers that the benchmarks run as processes of their own on loopback (moto in server
mode, the fake Slack and Anthropic APIs), and the fake AWS credentials that keep them, the
gateway and the benchmark itself away from real AWS."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
from benchkit import BenchError
from botocore.exceptions import BotoCoreError, ClientError
from routing import PROJECT_ROOT, free_port

REGION = "us-east-1"
BUCKET = "gateway-bench-transcripts"
# Fake credentials and no shared AWS files: nothing on this machine can reach real AWS.
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}
AWS_ENV_REMOVED = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def spawn_logged(command: Sequence[str], *, cwd: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Start `command` with the project on its PYTHONPATH, its stdout and stderr in `log_path`
    (this program's stdout carries its JSON and nothing else), in a session of its own: the
    terminal's Ctrl-C reaches the benchmark, which then stops it in order."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    with log_path.open("wb") as log:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdout=log, stderr=log, start_new_session=True
        )


@dataclass
class Service:
    """A helper server run as a process of its own, its output in a log file."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def tail(self, lines: int = 15) -> str:
        """The end of its log."""
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def run_service(
    name: str, command: Sequence[str], *, port: int, workdir: Path
) -> Iterator[Service]:
    """Start `command`, wait until its port answers HTTP, SIGTERM it at the end."""
    log_path = workdir / f"{name}.log"
    process = spawn_logged(command, cwd=PROJECT_ROOT, log_path=log_path)
    service = Service(name, process, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{service.url}/", timeout=1)  # any answer: the server is up
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"{name} did not start:\n{service.tail()}")
            time.sleep(0.1)
        yield service
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def use_fake_aws_credentials() -> None:
    """This process and its children (moto, the gateway) get fake AWS credentials only."""
    for name in AWS_ENV_REMOVED:
        os.environ.pop(name, None)
    os.environ.update(FAKE_AWS_ENV)


@contextlib.contextmanager
def moto_server(workdir: Path) -> Iterator[Service]:
    """moto in server mode on a free loopback port (`s3_server.py`: connections kept open, as
    S3 keeps them), its log `workdir/moto.log`; stopped at the end. Call
    `use_fake_aws_credentials` first: moto inherits them."""
    port = free_port()
    command = [
        sys.executable,
        str(Path(__file__).with_name("s3_server.py")),
        "127.0.0.1",
        str(port),
    ]
    with run_service("moto", command, port=port, workdir=workdir) as moto:
        yield moto


def create_bucket(endpoint_url: str, boto_session: boto3.session.Session | None = None) -> None:
    """The transcripts' bucket `BUCKET`, made through `boto_session` (else boto3's default
    one); `BenchError` when it cannot be made."""
    session = boto_session or boto3.session.Session(region_name=REGION)
    client = session.client("s3", endpoint_url=endpoint_url, region_name=REGION)
    try:
        client.create_bucket(Bucket=BUCKET)
    except (ClientError, BotoCoreError) as exc:
        raise BenchError(f"cannot create the bucket on moto: {exc}") from exc
    finally:
        client.close()
