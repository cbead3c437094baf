"""Faults injected into running gateways: nothing accepted is lost, nothing is answered twice.

Each test drives real servers over loopback sockets: gateway processes (`python -m gateway
run`) or a gateway in the test's event loop, PostgreSQL, an S3-compatible server behind a proxy
that can cut it off, and fake Slack and Anthropic APIs that fail on command.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from moto.server import ThreadedMotoServer
from sqlalchemy import func, make_url, select

from storage.models import InboundEvent, OutboundMessage, SessionCompaction, SessionMessage
from tests.conftest import POSTGRES_ADMIN_URL, _libpq_url
from tests.e2e.harness import free_port, gateway_config, running_gateway
from tests.e2e.test_processes import GATEWAY_PROCESSES, GatewayProcess
from tests.fakes.anthropic_api import FakeAnthropicAPI, Scripted
from tests.fakes.slack_api import (
    SIGNING_SECRET,
    TEAM,
    FakeSlackAPI,
    SlackFailure,
    direct_message,
    event_envelope,
    sign,
)
from tests.reliability.faults import CuttableProxy, block_database

pytestmark = pytest.mark.postgres

LEASE = 10  # seconds a killed process's claimed replies wait (`storage.reply_lease`)


def slack_process_config(
    tmp_path: Path,
    name: str,
    port: int,
    database_url: str,
    api: FakeSlackAPI,
    latency: str,
    *,
    token_interval: str = "null",
    reply_lease: str = "120s",
) -> Path:
    users = ", ".join(f'{{id: u{n}, org: acme, slack: ["{TEAM}:U{n:04d}"]}}' for n in range(10))
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"""
server: {{host: 127.0.0.1, port: {port}}}
storage:
  database_url: "{database_url}"
  transcripts: {{backend: local, local_path: "{tmp_path / "transcripts"}"}}
  reply_lease: {reply_lease}
llm: {{offline_latency: {latency}, offline_token_interval: {token_interval}}}
organizations: [{{id: acme, name: Acme}}]
identity:
  users: [{users}]
channels:
  slack:
    enabled: true
    bot_token: xoxb-test
    signing_secret: "{SIGNING_SECRET}"
    api_base_url: "{api.url}"
"""
    )
    return path


def slack_gateway_config(database_url: str, tmp_path: Path, api: FakeSlackAPI) -> Any:
    """A gateway in the test's event loop with ten Slack users (U0000 … U0009)."""
    return gateway_config(
        database_url,
        tmp_path,
        identity={
            "users": [
                {"id": f"u{n}", "org": "acme", "slack": [f"{TEAM}:U{n:04d}"]} for n in range(10)
            ]
        },
        channels={
            "slack": {
                "enabled": True,
                "bot_token": "xoxb-test",
                "signing_secret": SIGNING_SECRET,
                "api_base_url": api.url,
            }
        },
    )


def dm_event(index: int) -> dict[str, Any]:
    user = index % 10
    event = direct_message(
        f"message number {index}",
        user=f"U{user:04d}",
        ts=f"{1_700_000_000 + index}.000100",
        channel=f"D{user:04d}",
    )
    return event_envelope(event, f"EvFault{index:04d}")


async def post_event(
    client: httpx.AsyncClient, url: str, envelope: dict[str, Any], retry: int = 0
) -> int:
    """Send one signed event as Slack does; the status, or 0 when nobody answered."""
    body = json.dumps(envelope).encode()
    headers = {"Content-Type": "application/json", **sign(body)}
    if retry:
        headers["X-Slack-Retry-Num"] = str(retry)
    try:
        answer = await client.post(f"{url}/slack/events", content=body, headers=headers)
    except httpx.TransportError:
        return 0
    return answer.status_code


def answered_texts(api: FakeSlackAPI) -> Counter[str]:
    """How often each message's text was answered (the offline model repeats it)."""
    found: Counter[str] = Counter()
    for post in api.posts():
        found.update(re.findall(r"message number (\d+)", str(post["text"])))
    return found


async def wait_until(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


@GATEWAY_PROCESSES
async def test_sigkill_mid_load_then_restart_answers_every_accepted_event_exactly_once(
    tmp_path: Path, fresh_postgres_url: str, slack_api: FakeSlackAPI
) -> None:
    port = free_port()
    config = slack_process_config(
        tmp_path, "gw", port, fresh_postgres_url, slack_api, "200ms", reply_lease=f"{LEASE}s"
    )
    events = [dm_event(index) for index in range(60)]
    first = GatewayProcess(config, port, tmp_path).start()
    second: GatewayProcess | None = None
    acknowledged: set[int] = set()
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            for index, envelope in enumerate(events):
                if index == 30:
                    assert first.process is not None
                    first.process.send_signal(signal.SIGKILL)
                    first.process.wait(timeout=10)
                if await post_event(client, first.url, envelope) == 200:
                    acknowledged.add(index)
            second = GatewayProcess(config, port, tmp_path).start()
            # Slack retries what was not acknowledged, and retries some that were.
            for index, envelope in enumerate(events):
                retry = 1 if index not in acknowledged else 2
                if index not in acknowledged or index % 7 == 0:
                    assert await post_event(client, second.url, envelope, retry) == 200
            # A reply the killed process had claimed waits for its lease to expire; one it
            # had posted but not marked is found in Slack, not posted again.
            await wait_until(lambda: len(slack_api.posts()) >= len(events), timeout=LEASE + 60)
            await asyncio.sleep(1.0)
    finally:
        for process in (first, second):
            if process is not None:
                process.kill()
    answered = answered_texts(slack_api)
    assert 0 < len(acknowledged) < len(events)
    assert sorted(answered) == sorted(str(index) for index in range(len(events)))
    assert set(answered.values()) == {1}, answered


async def test_a_database_outage_answers_503_then_recovers_without_losing_anything(
    tmp_path: Path, fresh_postgres_url: str, slack_api: FakeSlackAPI
) -> None:
    admin = _libpq_url(POSTGRES_ADMIN_URL)
    database = make_url(fresh_postgres_url).database
    assert database is not None
    config = slack_gateway_config(fresh_postgres_url, tmp_path, slack_api)
    events = [dm_event(index) for index in range(12)]
    async with running_gateway(config) as gateway:
        client = gateway.client
        for envelope in events[:4]:
            assert await post_event(client, "", envelope) == 200
        await wait_until(lambda: len(slack_api.posts()) >= 4)

        block_database(admin, database, blocked=True)
        try:
            ready = await client.get("/readyz")
            refused = [await post_event(client, "", envelope) for envelope in events[4:8]]
            web = await client.post("/web/v1/messages", json={"user": "u1", "text": "hi"})
        finally:
            block_database(admin, database, blocked=False)

        assert ready.status_code == 503
        assert all(status >= 500 for status in refused), refused  # Slack will retry these
        assert web.status_code == 503

        deadline = time.monotonic() + 30
        while (await client.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        for envelope in events[4:]:  # the retries, and new events
            assert await post_event(client, "", envelope, retry=1) == 200
        await wait_until(lambda: len(slack_api.posts()) >= len(events))
        await asyncio.sleep(1.0)
    answered = answered_texts(slack_api)
    assert sorted(answered) == sorted(str(index) for index in range(len(events)))
    assert set(answered.values()) == {1}, answered


async def test_s3_down_during_compaction_defers_it_and_it_completes_later(
    tmp_path: Path, fresh_postgres_url: str, s3_endpoint: str
) -> None:
    # `s3_endpoint` sets the fake AWS credentials; this test runs its own server behind a proxy.
    moto_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port)
    moto.start()
    proxy = CuttableProxy("127.0.0.1", moto_port)
    await proxy.start()
    endpoint = f"http://127.0.0.1:{proxy.port}"
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    # Through the proxy, which runs in this event loop: the blocking call goes to a thread.
    await asyncio.to_thread(s3.create_bucket, Bucket="transcripts")
    config = gateway_config(
        fresh_postgres_url,
        tmp_path,
        storage={
            "database_url": fresh_postgres_url,
            "transcripts": {
                "backend": "s3",
                "s3": {"bucket": "transcripts", "endpoint_url": endpoint},
            },
        },
        sessions={"compaction": {"max_messages": 6, "keep_last_messages": 2}},
    )
    try:
        async with running_gateway(config) as gateway:
            proxy.cut()
            for n in range(6):
                await gateway.post("alice", f"fact number {n}: anvils weigh {n} tons")
                await gateway.wait_for_replies("alice", n + 1, settle=0, timeout=60)
            async with gateway.runtime.database.session() as db:
                compactions_while_down = await db.scalar(
                    select(func.count()).select_from(SessionCompaction)
                )
                stored = await db.scalar(select(func.count()).select_from(SessionMessage))
            metrics = (await gateway.client.get("/metrics")).text
            proxy.restore()
            # The next turn compacts first (the background job retries token-triggered ones).
            await gateway.post("alice", "what do anvils weigh?")
            (*_, last) = await gateway.wait_for_replies("alice", 7, settle=0, timeout=60)
            async with gateway.runtime.database.session() as db:
                compactions_after = list((await db.execute(select(SessionCompaction))).scalars())
    finally:
        await proxy.stop()
        moto.stop()
    assert compactions_while_down == 0
    assert stored == 12  # every message kept while the archive could not be written
    assert any(
        line.startswith("gateway_archive_failures_total") and not line.endswith(" 0.0")
        for line in metrics.splitlines()
    )
    assert len(compactions_after) == 1
    assert compactions_after[0].archive_ref.endswith("full_transcript_pre_compact_001.jsonl")
    assert "what do anvils weigh?" in last["text"]


async def test_model_errors_are_retried_then_apologised_for_and_the_message_is_kept(
    tmp_path: Path, fresh_postgres_url: str
) -> None:
    with FakeAnthropicAPI() as anthropic:
        config = gateway_config(
            fresh_postgres_url,
            tmp_path,
            llm={
                "provider": "anthropic",
                "api_key": "sk-test",
                "base_url": anthropic.url,
                "max_retries": 2,
                "timeout": "2s",
            },
        )
        async with running_gateway(config) as gateway:
            # An overload storm longer than the retries: an apology.
            overloaded = Scripted(status=529, headers={"retry-after": "0"})
            anthropic.script.extend([overloaded] * 3)
            await gateway.post("alice", "first question", message_id="q1")
            (apology,) = await gateway.wait_for_replies("alice", 1, timeout=60)
            # Timeouts and a malformed answer, then success within the retries.
            anthropic.script.extend(
                [Scripted(delay=3.0), Scripted(raw="{not json"), Scripted(text="All good now.")]
            )
            await gateway.post("alice", "second question", message_id="q2")
            replies = await gateway.wait_for_replies("alice", 2, timeout=60)
            async with gateway.runtime.database.session() as db:
                user_messages = list(
                    (
                        await db.execute(
                            select(SessionMessage.content).where(SessionMessage.role == "user")
                        )
                    ).scalars()
                )
                failed = list(
                    (
                        await db.execute(select(InboundEvent.status).order_by(InboundEvent.id))
                    ).scalars()
                )
    assert apology["in_reply_to"] == "q1"
    assert "sorry" in apology["text"].lower()
    assert replies[1]["in_reply_to"] == "q2"
    assert replies[1]["text"] == "All good now."
    assert user_messages == ["first question", "second question"]
    assert failed == ["failed", "done"]


async def test_a_slack_rate_limit_and_error_storm_still_posts_each_reply_once(
    tmp_path: Path, fresh_postgres_url: str, slack_api: FakeSlackAPI
) -> None:
    for attempt in range(1, 13):
        if attempt % 3:
            slack_api.fail_attempts[attempt] = SlackFailure(429, "ratelimited", "0")
        else:
            slack_api.fail_attempts[attempt] = SlackFailure(503, "service_unavailable", None)
    config = slack_gateway_config(fresh_postgres_url, tmp_path, slack_api)
    events = [dm_event(index) for index in range(6)]
    async with running_gateway(config) as gateway:
        for envelope in events:
            assert await post_event(gateway.client, "", envelope) == 200
        await wait_until(lambda: len(slack_api.posts()) >= len(events), timeout=90)
        await asyncio.sleep(1.0)
        async with gateway.runtime.database.session() as db:
            statuses = list((await db.execute(select(OutboundMessage.status))).scalars())
    answered = answered_texts(slack_api)
    assert sorted(answered) == sorted(str(index) for index in range(len(events)))
    assert set(answered.values()) == {1}, answered
    assert statuses == ["delivered"] * len(events)


@GATEWAY_PROCESSES
async def test_the_same_event_ten_times_at_once_on_two_processes_gets_one_reply(
    tmp_path: Path, fresh_postgres_url: str, slack_api: FakeSlackAPI
) -> None:
    ports = [free_port(), free_port()]
    processes = [
        GatewayProcess(
            slack_process_config(tmp_path, f"gw{n}", port, fresh_postgres_url, slack_api, "50ms"),
            port,
            tmp_path,
        ).start()
        for n, port in enumerate(ports)
    ]
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            statuses = []
            for index in range(5):
                envelope = dm_event(index)
                statuses += await asyncio.gather(
                    *(
                        post_event(client, processes[n % 2].url, envelope, retry=n)
                        for n in range(10)
                    )
                )
            await wait_until(lambda: len(slack_api.posts()) >= 5)
            await asyncio.sleep(1.5)
    finally:
        for process in processes:
            process.kill()
    assert statuses == [200] * 50
    answered = answered_texts(slack_api)
    assert sorted(answered) == ["0", "1", "2", "3", "4"]
    assert set(answered.values()) == {1}, answered
