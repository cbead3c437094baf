"""Web live replies through a whole gateway: an event-stream client sees the status and the
growing answer, then the reply exactly as the JSON feed has it; and a gateway with open event
streams stops promptly."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from gateway.runtime import GatewayRuntime
from gateway.server import http_server
from storage.models import InboundEvent, OutboundMessage
from tests.channels.web_channel_harness import Event, EventReader, open_stream
from tests.e2e.harness import free_port, gateway_config, running_gateway
from tests.e2e.test_processes import GatewayProcess

QUESTION = "tell me about anvils and hammers and forges and the smiths who use them every day"


def live_config(database_url: str, tmp_path: Path, **web: Any) -> Any:
    """A gateway whose offline model writes its answer word by word, 50 ms a word."""
    return gateway_config(
        database_url,
        tmp_path,
        llm={"offline_token_interval": "50ms"},
        channels={"web": {"streaming": True, **web}},
    )


async def events_until_message(events: EventReader) -> list[Event]:
    async with asyncio.timeout(20):
        return await events.until("message")


async def read_to_the_end(events: EventReader) -> None:
    """Read events until the stream ends (`EOFError`); a stream still open after 5 s fails."""
    async with asyncio.timeout(5):
        while True:
            await events.next()


async def test_an_event_stream_shows_the_status_and_growing_answer_then_the_feeds_reply(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(live_config(database_url, tmp_path)) as gateway:
        async with open_stream(gateway.client) as events:
            posted = await gateway.post("alice", QUESTION, message_id="m1")
            assert posted.status_code == 202
            seen = await events_until_message(events)
        feed = await gateway.replies("alice")
        history = await gateway.client.get("/web/v1/history", params={"user": "alice"})
        async with gateway.runtime.database.session() as db:
            (reply,) = (await db.execute(select(OutboundMessage))).scalars()
            (event,) = (await db.execute(select(InboundEvent))).scalars()

    *live, message = seen
    assert live[0] == Event("status", {"in_reply_to": "m1", "text": "Thinking…"})
    texts = [event.data["text"] for event in live if event.name == "text"]
    assert len(texts) >= 2, live  # the answer grew while it was written
    for shorter, longer in itertools.pairwise(texts):
        assert longer.startswith(shorter)
        assert len(longer) > len(shorter)
    assert {event.name for event in live} <= {"status", "text", "done"}
    assert all(event.data["in_reply_to"] == "m1" for event in live)
    # The final message is the feed's item, the cursor its id; the streamed text a preview.
    (item,) = feed["messages"]
    assert message.data == item
    assert message.id == feed["cursor"]
    assert item["text"] == reply.content
    assert reply.content.startswith(texts[-1])
    assert f"You said: «{QUESTION}»" in reply.content
    # The JSON feed is what it was before streaming existed.
    assert set(item) == {
        "message_id",
        "role",
        "text",
        "session_id",
        "thread_id",
        "in_reply_to",
        "created_at",
    }
    assert (item["role"], item["in_reply_to"]) == ("assistant", "m1")
    assert (reply.status, event.status) == ("delivered", "done")
    assert event.live_reply is None  # no platform message to finish on the web
    # After the turn, the history holds the user's own message and the reply.
    assert history.status_code == 200
    mine, answer = history.json()["messages"]
    assert (mine["role"], mine["message_id"], mine["text"]) == ("user", "m1", QUESTION)
    assert answer == item


async def test_with_streaming_off_the_stream_gets_only_the_reply(
    database_url: str, tmp_path: Path
) -> None:
    config = live_config(database_url, tmp_path, streaming=False)
    async with running_gateway(config) as gateway:
        async with open_stream(gateway.client) as events:
            assert (await gateway.post("alice", "just answer", message_id="m1")).status_code == 202
            seen = await events_until_message(events)
        feed = await gateway.replies("alice")
        live_updates = gateway.runtime.metrics.live_updates.collect()
    assert [event.name for event in seen] == ["message"]
    assert seen[0].data == feed["messages"][0]
    assert "You said: «just answer»" in seen[0].data["text"]
    assert not [sample for metric in live_updates for sample in metric.samples if sample.value]


async def test_a_gateway_with_an_open_event_stream_stops_within_seconds(
    database_url: str, tmp_path: Path
) -> None:
    """The HTTP server the gateway serves with ends open streams when it starts to stop (a
    stream would otherwise hold the shutdown for its 25 seconds)."""
    runtime = await GatewayRuntime.start(live_config(database_url, tmp_path))
    port = free_port()
    server = http_server(runtime, "127.0.0.1", port)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not serving.done(), serving.result()
            await asyncio.sleep(0.01)
        client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10)
        async with client, open_stream(client) as events:
            started = time.monotonic()
            server.should_exit = True
            await asyncio.wait({serving}, timeout=5)
            stopped_after = time.monotonic() - started
            assert serving.done(), "the server still waits for the open stream"
            serving.result()
            with pytest.raises(EOFError):  # the stream ended; its client reconnects elsewhere
                await read_to_the_end(events)
    finally:
        server.force_exit = True
        await serving
        await runtime.close()
    assert stopped_after < 3, stopped_after


async def test_sigterm_stops_a_gateway_process_with_an_open_event_stream_within_seconds(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"""
server: {{host: 127.0.0.1, port: {port}}}
storage:
  database_url: "sqlite+aiosqlite:///{tmp_path / "gateway.db"}"
  transcripts: {{backend: local, local_path: "{tmp_path / "transcripts"}"}}
organizations: [{{id: acme, name: Acme}}]
identity:
  users: [{{id: alice, org: acme, name: Alice}}]
"""
    )
    gateway = GatewayProcess(config, port, tmp_path).start()
    assert gateway.process is not None
    try:
        async with (
            httpx.AsyncClient(base_url=gateway.url, timeout=10) as client,
            open_stream(client) as events,
        ):
            started = time.monotonic()
            gateway.process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(gateway.process.wait, 20)
            stopped_after = time.monotonic() - started
            with pytest.raises(EOFError):  # ended cleanly, not cut off
                await read_to_the_end(events)
    finally:
        gateway.kill()
    assert code == 0, gateway.log_text()
    assert stopped_after < 5, (stopped_after, gateway.log_text())
