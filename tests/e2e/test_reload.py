"""SIGHUP on a real `gateway run` process: a valid config applies identity changes without a
restart; an invalid one is refused with its problems logged, and the gateway keeps serving
with the config it had. Each reloadable group of keys takes effect with the next request,
seen from outside (the model API's requests, `/status`, the web API's and the SMTP
listener's answers); a restart-only change is reported and not applied."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sessions.recall_tool import SEARCH_TOOL_NAME
from tests.channels.email_mail import ASSISTANT, mail, smtp_code
from tests.e2e.harness import free_port, gateway_client
from tests.e2e.test_processes import GATEWAY_PROCESSES, GatewayProcess
from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.fakes.smtp_sink import SmtpSink

pytestmark = GATEWAY_PROCESSES
WAIT_SECONDS = 60  # hang guards only: a reply or a log record is due in well under a second

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
    deadline = time.monotonic() + WAIT_SECONDS
    while len(found := replies(url, user)) < count:
        assert time.monotonic() < deadline, found
        time.sleep(0.1)
    return found


def wait_for_log(gateway: GatewayProcess, event: str, after: int) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
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


PROMPT_ONE = "You are the first assistant."
PROMPT_TWO = "You are the reloaded assistant."
TOKEN_ALICE = "token-alice-0001"
TOKEN_BOB = "token-bob-0002"
CAROL = "carol@acme.invalid"  # `.invalid`: no DNS record can vouch for her mail


@dataclass
class ReloadingGateway:
    """A `gateway run` process, the config it was started with (edit, then `reload`), the
    fake model API it talks to and the SMTP sink its replies go to."""

    process: GatewayProcess
    config: dict[str, Any]
    email_port: int
    api: FakeAnthropicAPI
    sink: SmtpSink


@pytest.fixture
async def reloading_gateway(
    tmp_path: Path, fake_api: FakeAnthropicAPI, sink: SmtpSink
) -> AsyncIterator[ReloadingGateway]:
    port, email_port = free_port(), free_port()
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port},
        "storage": {
            "database_url": f"sqlite+aiosqlite:///{tmp_path}/gateway.db",
            "transcripts": {"backend": "local", "local_path": str(tmp_path / "transcripts")},
        },
        "llm": {
            "provider": "anthropic",
            "api_key": "test",
            "base_url": fake_api.url,
            "model": "model-one",
            "system_prompt": PROMPT_ONE,
            "max_tokens": 1000,
        },
        "organizations": [{"id": "acme", "name": "Acme"}],
        "identity": {
            "users": [
                {"id": "alice", "org": "acme"},
                {"id": "bob", "org": "acme"},
                {"id": "carol", "org": "acme", "email": [CAROL]},
            ]
        },
        "channels": {
            "web": {"dev_open": False, "tokens": [{"token": TOKEN_ALICE, "user": "alice"}]},
            "email": {
                "enabled": True,
                "listen_port": email_port,
                "addresses": [ASSISTANT],
                "auth": {"mode": "verify"},
                "outbound": {"host": "127.0.0.1", "port": sink.port},
            },
        },
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    process = GatewayProcess(path, port, tmp_path)
    await asyncio.to_thread(process.start)
    yield ReloadingGateway(process, config, email_port, fake_api, sink)
    await asyncio.to_thread(process.kill, signal.SIGTERM)


async def logged(gateway: GatewayProcess, event: str, after: int) -> list[dict[str, Any]]:
    """The JSON log records of `event` written after offset `after`, once there is one."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        records = []
        for line in gateway.log_text()[after:].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # not a JSON record (or not written to its end yet)
            if isinstance(record, dict) and record.get("event") == event:
                records.append(record)
        if records:
            return records
        assert time.monotonic() < deadline, gateway.log_text()[after:]
        await asyncio.sleep(0.05)


async def reload(gateway: ReloadingGateway) -> dict[str, Any]:
    """Write `gateway.config` to the file, send SIGHUP; the `config.reloaded` record."""
    process = gateway.process
    assert process.process is not None
    process.config.write_text(yaml.safe_dump(gateway.config))
    mark = len(process.log_text())
    process.process.send_signal(signal.SIGHUP)
    (record,) = await logged(process, "config.reloaded", mark)
    return record


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def say(client: httpx.AsyncClient, token: str, text: str, message_id: str) -> str:
    """Post `text` as the token's user; the text of the reply to it, once it arrived."""
    posted = await client.post(
        "/web/v1/messages", json={"text": text, "message_id": message_id}, headers=bearer(token)
    )
    assert posted.status_code == 202, posted.text
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        feed = await client.get("/web/v1/messages", headers=bearer(token))
        for reply in feed.json()["messages"]:
            if reply["in_reply_to"] == message_id:
                return str(reply["text"])
        assert time.monotonic() < deadline, f"no reply to {message_id}"
        await asyncio.sleep(0.05)


async def turn_request(
    client: httpx.AsyncClient, api: FakeAnthropicAPI, text: str, message_id: str
) -> dict[str, Any]:
    """Alice says `text`; the body of the model request her turn made."""
    before = len(api.replies)
    await say(client, TOKEN_ALICE, text, message_id)
    (request,) = api.replies[before:]
    return request


def tools_of(request: dict[str, Any]) -> set[str]:
    return {tool["name"] for tool in request.get("tools", [])}


async def test_each_reloadable_group_applies_to_the_next_request_and_restart_only_keys_wait(
    reloading_gateway: ReloadingGateway,
) -> None:
    gateway, config, api = reloading_gateway, reloading_gateway.config, reloading_gateway.api
    unsigned = mail("Can you hear me?", sender=f"Carol <{CAROL}>", message_id="<c1@acme.invalid>")
    async with gateway_client(gateway.process.url) as client:
        before = await turn_request(client, api, "Hello", "m1")
        assert PROMPT_ONE in before["system"]
        assert (before["max_tokens"], before["model"]) == (1000, "model-one")
        assert SEARCH_TOOL_NAME in tools_of(before)
        assert "of 50000 tokens" in await say(client, TOKEN_ALICE, "/status", "s1")
        refused = await client.post(
            "/web/v1/messages", json={"text": "Hi, I am Bob"}, headers=bearer(TOKEN_BOB)
        )
        assert refused.status_code == 401
        # 550 when DNS answers (no record vouches for `.invalid`), 451 when it cannot be asked.
        assert await smtp_code(gateway.email_port, unsigned, mail_from=CAROL) in (550, 451)

        # The prompt and answer length (reloadable) with the model (restart only).
        config["llm"] |= {"system_prompt": PROMPT_TWO, "max_tokens": 777, "model": "model-two"}
        reloaded = await reload(gateway)
        assert (reloaded["applied"], reloaded["needs_restart"]) == (["engine"], ["llm.model"])
        after = await turn_request(client, api, "Hello again", "m2")
        assert PROMPT_TWO in after["system"]
        assert PROMPT_ONE not in after["system"]
        assert (after["max_tokens"], after["model"]) == (777, "model-one")

        # The history budget, which `/status` shows. The model change is reported again:
        # the running config still says what the process does.
        config["sessions"] = {"history_budget_tokens": 54321}
        reloaded = await reload(gateway)
        assert (reloaded["applied"], reloaded["needs_restart"]) == (
            ["engine", "turn"],
            ["llm.model"],
        )
        assert "of 54321 tokens" in await say(client, TOKEN_ALICE, "/status", "s2")

        # Recall without its tool.
        config["recall"] = {"tool": False}
        assert (await reload(gateway))["applied"] == ["engine"]
        without_tool = await turn_request(client, api, "Anything from before?", "m3")
        assert SEARCH_TOOL_NAME not in tools_of(without_tool)

        # A new web token.
        config["channels"]["web"]["tokens"].append({"token": TOKEN_BOB, "user": "bob"})
        assert (await reload(gateway))["applied"] == ["channels.web"]
        assert await say(client, TOKEN_BOB, "Hi, I am Bob", "b1")

        # Email sender authentication off.
        config["channels"]["email"]["auth"] = {"mode": "off"}
        assert (await reload(gateway))["applied"] == ["channels.email"]
        accepted = mail("Can you hear me now?", sender=f"Carol <{CAROL}>", message_id="<c2@x.y>")
        assert await smtp_code(gateway.email_port, accepted, mail_from=CAROL) == 250
        (answer,) = await gateway.sink.wait_for(1, timeout=WAIT_SECONDS)
        assert answer.rcpt_tos == [CAROL]

        # Compaction after two messages: the next turn summarises the older ones first.
        config["sessions"]["compaction"] = {"max_messages": 2, "keep_last_messages": 1}
        assert (await reload(gateway))["applied"] == ["engine"]
        mark, summaries = len(gateway.process.log_text()), len(api.requests)
        compacted = await turn_request(client, api, "Still there?", "m4")
        assert any(
            str(request.get("system", "")).startswith("Summarise the conversation below")
            for request in api.requests[summaries:]
        )
        (record,) = await logged(gateway.process, "session.compacted", mark)
        assert record["messages_compacted"] > 0
        assert compacted["model"] == "model-one"
    assert gateway.process.process is not None
    assert gateway.process.process.poll() is None
