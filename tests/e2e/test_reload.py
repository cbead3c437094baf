"""SIGHUP on a real `gateway run` process: a valid config applies identity changes without a
restart; an invalid one is refused with its problems logged, and the gateway keeps serving
with the config it had."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import free_port
from tests.e2e.test_processes import GatewayProcess

CONFIG = """
server: {{host: 127.0.0.1, port: {port}}}
storage:
  database_url: "sqlite+aiosqlite:///{folder}/gateway.db"
  transcripts: {{backend: local, local_path: "{folder}/transcripts"}}
organizations: [{{id: acme, name: Acme}}]
identity:
  users: [{users}]
"""


def write(path: Path, port: int, users: str) -> None:
    path.write_text(CONFIG.format(port=port, folder=path.parent, users=users))


def replies(url: str, user: str) -> list[str]:
    answer = httpx.get(f"{url}/web/v1/messages", params={"user": user}, timeout=5)
    return [message["text"] for message in answer.json()["messages"]]


def wait_for(url: str, user: str, count: int) -> list[str]:
    deadline = time.monotonic() + 15
    while len(found := replies(url, user)) < count:
        assert time.monotonic() < deadline, found
        time.sleep(0.1)
    return found


def wait_for_log(gateway: GatewayProcess, event: str, after: int) -> None:
    deadline = time.monotonic() + 15
    while event not in gateway.log_text()[after:]:
        assert time.monotonic() < deadline, gateway.log_text()[after:]
        time.sleep(0.05)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    port = free_port()
    config = tmp_path / "gateway.yaml"
    write(config, port, "{id: alice, org: acme}")
    process = GatewayProcess(config, port, tmp_path).start()
    yield process
    process.kill(signal.SIGTERM)


def test_sighup_applies_new_users_and_keeps_the_old_config_when_the_new_one_is_invalid(
    gateway: GatewayProcess,
) -> None:
    assert gateway.process is not None
    post = f"{gateway.url}/web/v1/messages"
    assert httpx.post(post, json={"user": "carol", "text": "hi"}).status_code == 202
    (refusal,) = wait_for(gateway.url, "carol", 1)
    assert "not enabled" in refusal

    write(gateway.config, gateway.port, "{id: alice, org: acme}, {id: carol, org: acme}")
    mark = len(gateway.log_text())
    gateway.process.send_signal(signal.SIGHUP)
    wait_for_log(gateway, "config.reloaded", mark)
    httpx.post(post, json={"user": "carol", "text": "now I am in"})
    assert "now I am in" in wait_for(gateway.url, "carol", 2)[1]

    gateway.config.write_text("server: {port: not-a-port}\nidentity: {users: [{id: carol}]}\n")
    mark = len(gateway.log_text())
    gateway.process.send_signal(signal.SIGHUP)
    wait_for_log(gateway, "config.reload_rejected", mark)
    assert "server.port" in gateway.log_text()[mark:]
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200
    httpx.post(post, json={"user": "carol", "text": "still here"})
    assert "still here" in wait_for(gateway.url, "carol", 3)[2]
    assert gateway.process.poll() is None
