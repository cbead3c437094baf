"""The `gateway` command, run as a real process: serve, shut down, check configs, migrate."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sessions.recall_embedding import model_files
from storage.database import Database

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "config" / "gateway.example.yaml"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def gateway(
    *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )


def write_config(tmp_path: Path, port: int, database_url: str, extra: str = "") -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        f"""
server: {{host: 127.0.0.1, port: {port}}}
storage:
  database_url: "{database_url}"
  transcripts: {{backend: local, local_path: "{tmp_path / "transcripts"}"}}
{extra}
"""
    )
    return path


class RunningGateway:
    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.base_url = f"http://127.0.0.1:{port}"

    def stop(self) -> tuple[int, list[dict[str, object]]]:
        self.process.send_signal(signal.SIGTERM)
        _, stderr = self.process.communicate(timeout=30)
        events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        return self.process.returncode, events


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[object]:
    started: list[RunningGateway] = []

    def start(config: Path, port: int) -> RunningGateway:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "run", "--config", str(config)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        running = RunningGateway(process, port)
        started.append(running)
        # Only a hang guard: starting takes seconds, more while other tests use the CPU.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"gateway exited early: {process.communicate()[1]}")
            try:
                if httpx.get(f"{running.base_url}/healthz", timeout=1).status_code == 200:
                    return running
            except httpx.TransportError:
                time.sleep(0.1)
        pytest.fail("gateway did not serve /healthz within 120s")

    yield start
    for running in started:
        if running.process.poll() is None:
            running.process.kill()
            running.process.communicate()


def test_run_serves_health_readiness_and_metrics_then_stops_cleanly_on_sigterm(
    tmp_path: Path, start_gateway: object
) -> None:
    port = free_port()
    config = write_config(tmp_path, port, f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}")
    running = start_gateway(config, port)  # type: ignore[operator]

    assert httpx.get(f"{running.base_url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{running.base_url}/readyz").json() == {"status": "ready"}
    metrics = httpx.get(f"{running.base_url}/metrics")
    assert metrics.status_code == 200
    assert 'gateway_info{database="sqlite"' in metrics.text
    assert 'gateway_http_requests_total{route="/readyz",status="200"} 1.0' in metrics.text
    assert httpx.get(f"{running.base_url}/nope").status_code == 404

    code, events = running.stop()
    assert code == 0
    names = [event["event"] for event in events]
    assert names.index("gateway.started") < names.index("gateway.stopping")
    assert names[-1] == "gateway.stopped"
    assert (tmp_path / "gw.db").exists()
    assert (tmp_path / "transcripts").is_dir()


def test_run_on_postgres_migrates_and_reports_ready(
    tmp_path: Path, start_gateway: object, fresh_postgres_url: str
) -> None:
    port = free_port()
    running = start_gateway(write_config(tmp_path, port, fresh_postgres_url), port)  # type: ignore[operator]
    assert httpx.get(f"{running.base_url}/readyz").json() == {"status": "ready"}
    assert running.stop()[0] == 0


def test_run_with_unreachable_database_exits_with_one_clear_line(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, free_port(), "postgresql+psycopg://gw:hunter2@127.0.0.1:1/gateway"
    )
    result = gateway("run", "--config", str(config))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("gateway:")]
    assert len(error_lines) == 1
    assert "is unreachable" in error_lines[0]
    assert "127.0.0.1:1" in error_lines[0]
    assert "hunter2" not in result.stderr


def test_a_turn_worker_numbered_beyond_the_configured_workers_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        'server: {turn_workers: 2}\nstorage: {database_url: "postgresql+psycopg://gw@127.0.0.1:1/gw"}\n'
    )
    result = gateway("run", "--role", "turns", "--worker", "2", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "gateway: --worker: worker 2 is not one of 0 to 1 (server.turn_workers is 2)"
    )


def test_config_check_of_the_example_prints_ok() -> None:
    result = gateway("config", "check", str(EXAMPLE_CONFIG), cwd=ROOT)
    assert (result.returncode, result.stdout) == (0, "ok\n")


def test_config_check_reports_every_problem_with_file_line_and_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("server:\n  port: eighty\nsessions:\n  archive_aftr: 24h\n")
    result = gateway("config", "check", str(config))
    assert result.returncode == 2
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{config}:2: server.port: ")
    assert lines[1].startswith(f"{config}:4: sessions.archive_aftr: ")
    assert "archive_after" in lines[1]


def test_config_check_of_malformed_yaml_is_not_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("server: {host: [\n")
    result = gateway("config", "check", str(config))
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout.startswith(f"{config}:")


def test_run_with_an_invalid_config_exits_2_naming_the_problem(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("llm:\n  api_key: ${GATEWAY_TEST_UNSET_VARIABLE}\n")
    result = gateway("run", "--config", str(config))
    assert result.returncode == 2
    assert "GATEWAY_TEST_UNSET_VARIABLE" in result.stderr
    assert "Traceback" not in result.stderr


def test_db_upgrade_migrates_sqlite_and_postgres(tmp_path: Path, fresh_postgres_url: str) -> None:
    for url in (f"sqlite+aiosqlite:///{tmp_path / 'up.db'}", fresh_postgres_url):
        config = write_config(tmp_path, free_port(), url)
        result = gateway("db", "upgrade", "--config", str(config))
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"database at revision {Database.head_revision()}")


def test_db_upgrade_with_unreachable_database_fails_clearly(tmp_path: Path) -> None:
    config = write_config(tmp_path, free_port(), "postgresql+psycopg://postgres@127.0.0.1:1/x")
    result = gateway("db", "upgrade", "--config", str(config))
    assert result.returncode == 1
    assert result.stderr.startswith("gateway: migrating database")
    assert "Traceback" not in result.stderr


def write_s3_config(tmp_path: Path, port: int, endpoint: str, bucket: str) -> Path:
    path = tmp_path / "gateway-s3.yaml"
    path.write_text(
        f"""
server: {{host: 127.0.0.1, port: {port}}}
storage:
  database_url: "sqlite+aiosqlite:///{tmp_path / "gw.db"}"
  transcripts:
    backend: s3
    s3: {{bucket: {bucket}, endpoint_url: "{endpoint}", region: us-east-1, prefix: gw}}
"""
    )
    return path


def test_run_with_a_missing_bucket_exits_with_one_clear_line(
    tmp_path: Path, s3_endpoint: str
) -> None:
    config = write_s3_config(tmp_path, free_port(), s3_endpoint, "no-such-bucket")
    result = gateway("run", "--config", str(config))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "gateway: S3 bucket 'no-such-bucket' does not exist" in result.stderr


def test_run_with_an_s3_transcript_store_serves(
    tmp_path: Path, s3_endpoint: str, bucket: str, start_gateway: object
) -> None:
    port = free_port()
    config = write_s3_config(tmp_path, port, s3_endpoint, bucket)
    running = start_gateway(config, port)  # type: ignore[operator]
    metrics = httpx.get(f"{running.base_url}/metrics").text
    assert 'transcripts="s3"' in metrics
    assert running.stop()[0] == 0


TEAMS_APP_ID = "2b7e6a0c-3f4d-4c1a-9e2b-5d6f7a8b9c0d"


def test_teams_package_writes_a_sideloadable_zip_from_the_config(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        free_port(),
        f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
        f'channels:\n  teams: {{app_id: "{TEAMS_APP_ID}"}}\n',
    )
    out = tmp_path / "teams-app.zip"
    result = gateway(
        "teams", "package", "--config", str(config), "--out", str(out), "--name", "Acme Helper"
    )
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout
    with zipfile.ZipFile(out) as package:
        assert sorted(package.namelist()) == ["color.png", "manifest.json", "outline.png"]
        manifest = json.loads(package.read("manifest.json"))
    assert manifest["id"] == TEAMS_APP_ID
    assert manifest["bots"][0]["botId"] == TEAMS_APP_ID
    assert manifest["name"]["short"] == "Acme Helper"


def test_teams_package_without_an_app_id_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = write_config(tmp_path, free_port(), f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}")
    out = tmp_path / "teams-app.zip"
    result = gateway("teams", "package", "--config", str(config), "--out", str(out))
    assert result.returncode == 2
    assert "channels.teams.app_id" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def seed_recall(url: str) -> None:
    """Alice and Bob, each with a session that mentions Acme."""
    import asyncio  # noqa: PLC0415
    from datetime import UTC, datetime  # noqa: PLC0415

    from storage.database import Database  # noqa: PLC0415
    from storage.repositories.sessions import SessionRepository  # noqa: PLC0415
    from storage.repositories.users import OrganizationRepository, UserRepository  # noqa: PLC0415

    async def seed() -> None:
        database = Database(url)
        await database.upgrade()
        at = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
        async with database.session() as db:
            await OrganizationRepository(db).upsert("acme", "Acme")
            for user, text in (
                ("alice", "We decided the Acme renewal is 4200 euros."),
                ("bob", "Bob's Acme renewal notes."),
            ):
                await UserRepository(db).upsert(user, "acme", user.title())
                session = await SessionRepository(db).create(user, "acme", at=at)
                await SessionRepository(db).append_message(
                    session.id, role="user", channel_type="web", content=text, at=at
                )
        await database.dispose()

    asyncio.run(seed())


def test_recall_search_prints_one_users_hits_as_json(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'recall.db'}"
    seed_recall(url)
    config = write_config(tmp_path, free_port(), url)
    result = gateway(
        "recall", "search", "--user", "alice", "Acme renewal?", "--config", str(config), "--json"
    )
    assert result.returncode == 0, result.stderr
    hits = json.loads(result.stdout)
    assert [hit["text"] for hit in hits] == ["We decided the Acme renewal is 4200 euros."]
    assert hits[0]["kind"] == "turn"
    assert hits[0]["speaker"] == "Alice"
    assert hits[0]["date"].startswith("2026-03-02T10:00:00")
    assert set(hits[0]) >= {"session_id", "message_id", "seq", "score"}

    unknown = gateway("recall", "search", "--user", "carol", "Acme", "--config", str(config))
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "gateway: no user 'carol'"


def test_recall_reindex_rebuilds_the_index_and_its_vectors(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'recall.db'}"
    seed_recall(url)
    config = write_config(tmp_path, free_port(), url)
    result = gateway("recall", "reindex", "--config", str(config))
    assert result.returncode == 0, result.stderr
    if model_files() is None:  # without the model, words only
        assert result.stdout == "recall index rebuilt: 2 entries, 0 vectors\n"
        return
    assert result.stdout == "recall index rebuilt: 2 entries, 2 vectors\n"
    assert "100% 2/2 vectors" in result.stderr  # the progress bar, drawn in place


# --- gateway email parse ------------------------------------------------------------------

FORWARDED_MAIL = b"""From: Alice Example <alice@example.com>
To: assistant@acme.example
Subject: Fwd: Budget 2025
Message-ID: <fw-1@example.com>
In-Reply-To: <reply.out-1@acme.example>
References: <root@example.com> <reply.out-1@acme.example>
Date: Sat, 01 Mar 2025 10:00:00 +0000
MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="B"

--B
Content-Type: text/plain; charset=utf-8

Please summarise.

---------- Forwarded message ---------
From: Bob Builder <bob@example.org>
Date: Mon, Feb 3, 2025 at 9:00 AM
Subject: Budget 2025
To: Alice <alice@example.com>


The budget is 10k.
--B
Content-Type: application/pdf; name="q1.pdf"
Content-Disposition: attachment; filename="q1.pdf"
Content-Transfer-Encoding: base64

JVBERi0xLjQK
--B--
"""


def test_email_parse_prints_the_message_the_gateway_would_route(tmp_path: Path) -> None:
    path = tmp_path / "forward.eml"
    path.write_bytes(FORWARDED_MAIL)
    result = gateway("email", "parse", str(path), "--json", "--no-auth")
    assert result.returncode == 0, result.stderr
    parsed = json.loads(result.stdout)
    assert parsed["message_id"] == "fw-1@example.com"
    assert parsed["thread_id"] == "root@example.com"
    assert parsed["in_reply_to"] == ["reply.out-1@acme.example"]
    assert set(parsed["references"]) == {"root@example.com", "reply.out-1@acme.example"}
    assert parsed["content"] == "Please summarise."
    assert parsed["forwarded"] == {
        "from": {"address": "bob@example.org", "name": "Bob Builder"},
        "subject": "Budget 2025",
        "date": "Mon, Feb 3, 2025 at 9:00 AM",
        "body": "The budget is 10k.",
    }
    assert parsed["attachments"] == [
        {"filename": "q1.pdf", "content_type": "application/pdf", "size": 9}
    ]
    assert parsed["auth"] == {"skipped": True}


def test_email_parse_explains_mail_it_cannot_route(tmp_path: Path) -> None:
    path = tmp_path / "junk.eml"
    path.write_bytes(b"\x00\xff binary junk without headers")
    result = gateway("email", "parse", str(path), "--json", "--no-auth")
    assert result.returncode == 1
    assert result.stderr.strip() == "gateway: the message has no valid From address"
    assert "Traceback" not in result.stderr

    missing = gateway("email", "parse", str(tmp_path / "absent.eml"), "--no-auth")
    assert missing.returncode == 1
    assert "cannot read" in missing.stderr
