"""Web live replies through a whole gateway: an event-stream client sees the status and the
growing answer, then the reply exactly as the JSON feed has it; and a gateway with open event
streams stops promptly."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from channels.base import ChannelMessage, ChannelType, Conversation
from gateway import turns
from gateway.runtime import GatewayRuntime
from gateway.server import SHUTDOWN_GRACE, http_server
from gateway.turn_values import QueuedEvent
from storage.models import InboundEvent, OutboundMessage
from tests.channels.web_channel_harness import Event, EventReader, open_stream
from tests.e2e.harness import free_port, gateway_client, gateway_config, running_gateway
from tests.e2e.test_processes import GATEWAY_PROCESSES, GatewayProcess

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


async def test_the_status_shows_as_the_message_arrives_before_its_turn_can_start(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(live_config(database_url, tmp_path)) as gateway:
        await gateway.post("alice", "hello", message_id="m0")  # alice is known from now on
        await gateway.wait_for_replies("alice", 1, settle=0)
        await gateway.wait_for_turns_to_end("alice")
        async with open_stream(gateway.client) as events:
            # Alice's turn lock is taken: her turn cannot start, her status still shows.
            async with gateway.runtime.locks.hold("user:alice") as held:
                assert held
                assert (await gateway.post("alice", QUESTION, message_id="m1")).status_code == 202
                async with asyncio.timeout(5):
                    while (first := await events.next()).name == "message":
                        pass  # the feed's earlier reply (m0) comes first
                unanswered = await gateway.replies("alice")
            seen = await events_until_message(events)
    assert first == Event("status", {"in_reply_to": "m1", "text": "Thinking…"})
    assert len(unanswered["messages"]) == 1  # only m0's reply while the lock was held
    # The turn took that live reply over: the answer streamed into it, then the reply.
    *live, message = seen
    assert [event.name for event in live].count("status") == 0  # no second "Thinking…"
    assert {event.name for event in live} <= {"text", "done"}
    assert any(event.name == "text" for event in live)
    assert message.data["in_reply_to"] == "m1"


async def test_a_status_shown_on_arrival_that_no_turn_here_takes_over_is_closed(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another gateway process answered the message: this one's early status must not spin on.
    monkeypatch.setattr(turns, "EARLY_LIVE_SECONDS", 0.0)
    async with running_gateway(live_config(database_url, tmp_path)) as gateway:
        await gateway.post("alice", "hello", message_id="m0")
        await gateway.wait_for_replies("alice", 1, settle=0)
        await gateway.wait_for_turns_to_end("alice")
        alice = gateway.runtime.dispatcher.identities.cached_sender("web:alice")
        assert alice is not None
        processor = gateway.runtime.dispatcher.processor
        async with open_stream(gateway.client) as events:
            processor.show_working(QueuedEvent(990, web_message("x1")), alice)
            processor.show_working(QueuedEvent(991, web_message("x2")), alice)  # closes x1
            async with asyncio.timeout(5):
                seen = [event async for event in _live_events(events, until=("done", "x1"))]
    assert Event("status", {"in_reply_to": "x1", "text": "Thinking…"}) in seen
    assert seen[-1] == Event("done", {"in_reply_to": "x1", "committed": False})


async def _live_events(events: EventReader, *, until: tuple[str, str]) -> Any:
    while True:
        event = await events.next()
        if event.name != "message":
            yield event
            if (event.name, event.data.get("in_reply_to")) == until:
                return


def web_message(message_id: str) -> ChannelMessage:
    """A web message of alice's, as the web channel parses one."""
    return ChannelMessage(
        channel_type=ChannelType.WEB,
        channel_id="alice",
        message_id=message_id,
        user_identifier="alice",
        content="hi",
        timestamp=datetime.now(UTC),
        conversation=Conversation.DIRECT,
    )


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
        client = gateway_client(f"http://127.0.0.1:{port}")
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


@GATEWAY_PROCESSES
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
            gateway_client(gateway.url) as client,
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
    # A stream that held the shutdown would end only at the grace period's end (or after its
    # own 25 s); well before that, with room for a busy machine (~1 s when idle).
    assert stopped_after < SHUTDOWN_GRACE - 2, (stopped_after, gateway.log_text())
