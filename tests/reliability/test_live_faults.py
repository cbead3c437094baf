"""Live replies under faults: a gateway killed mid-stream, a platform failing mid-stream. The
streamed message is the turn's one reply; it is always finished, never doubled."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from storage.models import InboundEvent, OutboundMessage
from tests.e2e.harness import free_port, running_gateway
from tests.e2e.test_processes import GATEWAY_PROCESSES, GatewayProcess
from tests.fakes.slack_api import (
    FakeSlackAPI,
    SlackFailure,
    direct_message,
    event_envelope,
    send_event,
)
from tests.reliability.test_faults import (
    post_event,
    slack_gateway_config,
    slack_process_config,
    wait_until,
)

CHANNEL = "D0001"
THREAD = "1700000000.000100"  # the DM thread the user writes in


def thread_message(text: str, ts: str) -> dict[str, Any]:
    """A DM in a thread (where Slack streams answers), as an Events API envelope."""
    event = direct_message(text, user="U0001", ts=ts, channel=CHANNEL, thread_ts=THREAD)
    return event_envelope(event, f"Ev{ts.replace('.', '')}")


def app_messages(api: FakeSlackAPI) -> list[Any]:
    return api.thread(CHANNEL, THREAD)


def streams_finished(api: FakeSlackAPI, count: int) -> bool:
    messages = app_messages(api)
    return len(messages) >= count and not any(message.streaming for message in messages)


@pytest.mark.postgres
@GATEWAY_PROCESSES
async def test_sigkill_mid_stream_then_restart_finishes_the_one_streamed_reply(
    tmp_path: Path, fresh_postgres_url: str, slack_api: FakeSlackAPI
) -> None:
    port = free_port()
    config = slack_process_config(
        tmp_path, "gw", port, fresh_postgres_url, slack_api, "null", token_interval="150ms"
    )
    first = GatewayProcess(config, port, tmp_path).start()
    second: GatewayProcess | None = None
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            envelope = thread_message("tell me a story", "1.1")
            assert await post_event(client, first.url, envelope) == 200
            # The answer is streaming: the message exists and text is being appended.
            await wait_until(lambda: bool(slack_api.calls_to("chat.startStream")))
            await asyncio.sleep(0.4)
            first.kill()
            streamed = app_messages(slack_api)
            assert len(streamed) == 1
            assert streamed[0].streaming
            second = GatewayProcess(config, port, tmp_path).start()
            await wait_until(lambda: streams_finished(slack_api, 1), timeout=60)
            await asyncio.sleep(1.0)  # nothing more may come
    finally:
        for process in (first, second):
            if process is not None:
                process.kill()
    messages = app_messages(slack_api)
    assert len(messages) == 1, messages  # the streamed message is the one reply
    final = messages[0]
    assert not final.streaming
    assert "You said: «tell me a story»" in final.text
    assert slack_api.posts(CHANNEL) == []  # nothing posted beside it
    assert len(slack_api.calls_to("chat.startStream")) == 1
    # No status left spinning: the finished reply came after the last status.
    statuses = slack_api.calls_to("assistant.threads.setStatus")
    finishes = slack_api.calls_to("chat.stopStream", "chat.update")
    assert statuses
    assert finishes
    assert max(call.at for call in finishes) > max(call.at for call in statuses)


async def test_rate_limits_and_errors_mid_stream_still_finish_the_answer_once(
    tmp_path: Path, database_url: str, slack_api: FakeSlackAPI
) -> None:
    config = slack_gateway_config(database_url, tmp_path, slack_api)
    config = config.model_copy(
        update={
            "llm": config.llm.model_copy(
                update={"offline_token_interval": timedelta(milliseconds=50)}
            )
        }
    )
    slack_api.fail(
        "chat.appendStream",
        SlackFailure(status=429, error="ratelimited", retry_after="1"),
        SlackFailure(status=500, error="internal_error", retry_after=None),
    )
    slack_api.fail("chat.stopStream", SlackFailure(status=503, error="service_unavailable"))
    async with running_gateway(config) as gateway:
        answer = await send_event(gateway.client, thread_message("are you there", "2.1"))
        assert answer.status_code == 200
        await wait_until(lambda: streams_finished(slack_api, 1), timeout=60)
        await asyncio.sleep(0.5)
        async with gateway.runtime.database.session() as db:
            replies = list((await db.execute(select(OutboundMessage))).scalars())
            events = list((await db.execute(select(InboundEvent))).scalars())
    messages = app_messages(slack_api)
    assert len(messages) == 1
    assert "You said: «are you there»" in messages[0].text
    assert messages[0].text.strip() == replies[0].content.strip()
    assert slack_api.posts(CHANNEL) == []
    assert [reply.status for reply in replies] == ["delivered"]
    assert replies[0].reply_context["live"]["ts"] == messages[0].ts
    assert events[0].live_reply is not None
    assert events[0].live_reply["ts"] == messages[0].ts
