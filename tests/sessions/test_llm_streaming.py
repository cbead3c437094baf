"""Streamed model calls: the Anthropic client over the real SDK against the fake Messages
API's server-sent events (deltas as they arrive, tool calls, streams that break off and are
started again, errors before the stream), and the offline model streaming at its pace."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator

import pytest

from errors import LLMError
from sessions.anthropic_llm import AnthropicLLM
from sessions.llm import LLMMessage, LLMRequest, OfflineLLM, word_tokens
from tests.fakes.anthropic_api import FakeAnthropicAPI, Scripted, claude
from tests.sessions.recorded_progress import RecordedProgress

ANSWER = "The quarterly report is due on Friday, and Bob owns the numbers."
TOOL_CALL = {
    "id": "toolu_fixed000001",
    "name": "lookup_account",
    "input": {"name": "Acme", "fields": ["owner", "renewal"], "nested": {"limit": 3}},
}


@pytest.fixture
async def llm(api: FakeAnthropicAPI) -> AsyncIterator[AnthropicLLM]:
    client = claude(api, max_retries=2)
    yield client
    await client.close()


def request(text: str = "hello") -> LLMRequest:
    return LLMRequest(system="Be brief.", messages=(LLMMessage("user", text),), max_tokens=100)


async def test_text_deltas_arrive_in_order_while_the_model_still_writes(
    api: FakeAnthropicAPI, llm: AnthropicLLM
) -> None:
    api.token_interval = 0.05
    api.script.append(Scripted(text=ANSWER))
    progress = RecordedProgress()

    response = await llm.complete(request(), progress=progress)
    returned = time.monotonic()

    assert api.requests[0]["stream"] is True
    sent = [event for event in api.sent_to(0) if event.text]
    assert progress.deltas == [event.text for event in sent] == word_tokens(ANSWER)
    assert "".join(progress.deltas) == response.text == ANSWER
    # The first words were shown before the server had even sent the last one.
    assert progress.calls[0].at < sent[-1].at
    (stop,) = [event for event in api.sent_to(0) if event.name == "message_stop"]
    assert progress.calls[0].at < stop.at
    assert all(call.at <= returned for call in progress.calls)
    assert [call.method for call in progress.calls] == ["text"] * len(sent)


async def test_a_streamed_answer_is_the_same_response_as_a_plain_one(
    api: FakeAnthropicAPI, llm: AnthropicLLM
) -> None:
    api.script.extend([Scripted(text=ANSWER), Scripted(text=ANSWER)])
    plain = await llm.complete(request())
    streamed = await llm.complete(request(), progress=RecordedProgress())
    assert "stream" not in api.requests[0]
    assert streamed == plain
    assert streamed.input_tokens > 0
    assert streamed.output_tokens > 1  # from message_delta, not message_start's placeholder


async def test_tool_calls_survive_streaming_exactly(
    api: FakeAnthropicAPI, llm: AnthropicLLM
) -> None:
    api.script.extend([Scripted(tool_use=TOOL_CALL), Scripted(tool_use=TOOL_CALL)])
    progress = RecordedProgress()
    streamed = await llm.complete(request("who owns Acme?"), progress=progress)
    plain = await llm.complete(request("who owns Acme?"))

    assert streamed == plain
    assert streamed.stop_reason == "tool_use"
    assert streamed.tool_calls == ({"type": "tool_use", **TOOL_CALL},)
    # The tool input travelled as several input_json_delta pieces.
    deltas = [event for event in api.sent_to(0) if event.name == "content_block_delta"]
    assert len(deltas) > len(word_tokens("Let me check.")) + 1
    assert "".join(progress.deltas) == "Let me check."


@pytest.mark.parametrize(
    "failure",
    [
        Scripted(text=ANSWER, stream_error="overloaded_error", fail_after_tokens=3),
        Scripted(text=ANSWER, drop_stream=True),
    ],
    ids=["overloaded_event", "dropped_connection"],
)
async def test_a_stream_that_breaks_off_is_reset_and_started_again(
    api: FakeAnthropicAPI, llm: AnthropicLLM, failure: Scripted
) -> None:
    api.script.extend([failure, Scripted(text=ANSWER)])
    progress = RecordedProgress()

    response = await llm.complete(request(), progress=progress)

    assert response.text == ANSWER
    assert len(api.requests) == 2
    broken = api.sent_to(0)
    assert broken[-1].name == ("error" if failure.stream_error else "dropped")
    shown_before = [event.text for event in broken if event.text]
    assert shown_before == word_tokens(ANSWER)[: failure.fail_after_tokens]
    methods = [call.method for call in progress.calls]
    assert methods == ["text"] * len(shown_before) + ["reset"] + ["text"] * len(word_tokens(ANSWER))
    assert progress.shown() == ANSWER


async def test_a_stream_that_keeps_breaking_fails_after_the_retries(
    api: FakeAnthropicAPI, llm: AnthropicLLM
) -> None:
    api.script.extend([Scripted(stream_error="overloaded_error")] * 3)
    progress = RecordedProgress()
    with pytest.raises(LLMError, match="overloaded_error"):
        await llm.complete(request(), progress=progress)
    assert len(api.requests) == 3  # max_retries=2
    assert [call.method for call in progress.calls].count("reset") == 2


async def test_a_permanent_error_in_the_stream_is_not_retried(
    api: FakeAnthropicAPI, llm: AnthropicLLM
) -> None:
    api.script.append(Scripted(stream_error="invalid_request_error"))
    progress = RecordedProgress()
    with pytest.raises(LLMError, match="invalid_request_error"):
        await llm.complete(request(), progress=progress)
    assert len(api.requests) == 1
    assert "reset" not in [call.method for call in progress.calls]


async def test_an_http_error_before_the_stream_is_an_llm_error_naming_the_status(
    api: FakeAnthropicAPI,
) -> None:
    llm = claude(api, max_retries=1)
    api.script.extend([Scripted(status=529, headers={"retry-after": "0"})] * 2)
    progress = RecordedProgress()
    with pytest.raises(LLMError, match=r"529.*overloaded_error"):
        await llm.complete(request(), progress=progress)
    await llm.close()
    # The SDK's own retry of the opening request, and no stream retries on top.
    assert len(api.requests) == 2
    assert progress.calls == []
    assert api.sent == []


async def test_the_offline_model_streams_its_reply_word_by_word() -> None:
    progress = RecordedProgress()
    streamed = await OfflineLLM().complete(request("stream this"), progress=progress)
    plain = await OfflineLLM().complete(request("stream this"))
    assert streamed == plain
    assert progress.deltas == word_tokens(plain.text)
    assert len(progress.deltas) > 5


async def test_the_offline_model_waits_latency_then_paces_its_words() -> None:
    latency, interval = 0.1, 0.02
    llm = OfflineLLM(latency=latency, token_interval=interval)
    progress = RecordedProgress()
    started = time.monotonic()
    response = await llm.complete(request("pace"), progress=progress)
    times = [call.at for call in progress.calls]
    tolerance = 0.005
    assert times[0] - started >= latency - tolerance
    assert all(b - a >= interval - tolerance for a, b in itertools.pairwise(times))
    # Unwatched, the call takes as long as writing the whole answer does.
    started = time.monotonic()
    assert await llm.complete(request("pace")) == response
    words = len(word_tokens(response.text))
    assert time.monotonic() - started >= latency + (words - 1) * interval - tolerance
