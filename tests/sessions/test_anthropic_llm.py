"""The Anthropic client over the real SDK against the fake Messages API (and Bedrock's path)."""

from __future__ import annotations

import pytest

from errors import LLMError
from sessions.anthropic_llm import AnthropicLLM, AnthropicSettings, to_api_messages
from sessions.llm import LLMMessage, LLMRequest
from tests.fakes.anthropic_api import FakeAnthropicAPI, Scripted, claude


def request(text: str = "hello") -> LLMRequest:
    return LLMRequest(system="Be brief.", messages=(LLMMessage("user", text),), max_tokens=100)


async def test_a_reply_carries_text_blocks_and_usage(api: FakeAnthropicAPI) -> None:
    llm = claude(api)
    response = await llm.complete(request("ping"))
    await llm.close()
    assert response.text == "Claude here. You said: ping"
    assert response.blocks == ({"type": "text", "text": "Claude here. You said: ping"},)
    assert response.input_tokens > 0
    assert response.output_tokens > 0
    (sent,) = api.requests
    assert sent["system"] == "Be brief."
    assert sent["model"] == "claude-sonnet-5-5"


async def test_errors_after_the_retries_become_llm_errors_naming_the_status(
    api: FakeAnthropicAPI,
) -> None:
    llm = claude(api, max_retries=1)
    api.script.extend([Scripted(status=529, headers={"retry-after": "0"})] * 2)
    with pytest.raises(LLMError, match="529"):
        await llm.complete(request())
    await llm.close()
    assert len(api.requests) == 2


async def test_bedrock_is_reached_through_the_same_client(
    api: FakeAnthropicAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    llm = AnthropicLLM(
        AnthropicSettings(
            provider="bedrock",
            model="anthropic.claude-sonnet-5-5",
            base_url=api.url,
            region="us-east-1",
        )
    )
    response = await llm.complete(request("via bedrock"))
    await llm.close()
    assert response.text == "Claude here. You said: via bedrock"
    assert api.bedrock_models == ["anthropic.claude-sonnet-5-5"]


def test_consecutive_messages_of_one_role_are_merged() -> None:
    merged = to_api_messages(
        [LLMMessage("user", "a"), LLMMessage("user", "b"), LLMMessage("assistant", "c")]
    )
    assert merged == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
    ]
