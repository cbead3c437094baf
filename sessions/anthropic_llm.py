"""The `LLMClient` on Anthropic's SDK: the Messages API directly, on Bedrock, or on Vertex.

Retries are the SDK's own: exponential backoff on 408/409/429/5xx (529 "overloaded"
included) and connection errors, honouring `retry-after`; timeouts per request. What still
fails after `max_retries` becomes an `LLMError` carrying the status and the API's message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anthropic
import structlog

from errors import LLMError
from sessions.llm import ContentBlock, LLMMessage, LLMRequest, LLMResponse

log = structlog.stdlib.get_logger(__name__)

MALFORMED_RETRY_SECONDS = 0.5

Provider = Literal["anthropic", "bedrock", "vertex"]


@dataclass(frozen=True, slots=True)
class AnthropicSettings:
    """How to reach the model."""

    provider: Provider
    model: str
    api_key: str = ""
    base_url: str | None = None
    timeout_seconds: float = 60.0
    max_retries: int = 4
    region: str | None = None
    project_id: str | None = None


def _client(settings: AnthropicSettings) -> Any:
    common: dict[str, Any] = {
        "timeout": settings.timeout_seconds,
        "max_retries": settings.max_retries,
    }
    if settings.base_url:
        common["base_url"] = settings.base_url
    if settings.provider == "bedrock":
        return anthropic.AsyncAnthropicBedrock(aws_region=settings.region, **common)
    if settings.provider == "vertex":
        if settings.region:
            common["region"] = settings.region
        if settings.project_id:
            common["project_id"] = settings.project_id
        return anthropic.AsyncAnthropicVertex(**common)
    return anthropic.AsyncAnthropic(api_key=settings.api_key, **common)


def to_api_messages(messages: Sequence[LLMMessage]) -> list[dict[str, Any]]:
    """Messages in the API's shape, consecutive same-role messages merged into one."""
    merged: list[dict[str, Any]] = []
    for message in messages:
        blocks: list[ContentBlock] = (
            [{"type": "text", "text": message.content}]
            if isinstance(message.content, str)
            else [dict(block) for block in message.content]
        )
        if merged and merged[-1]["role"] == message.role:
            merged[-1]["content"].extend(blocks)
        else:
            merged.append({"role": message.role, "content": blocks})
    return merged


class AnthropicLLM:
    """Completions from Claude through the `anthropic` SDK."""

    def __init__(self, settings: AnthropicSettings) -> None:
        self.settings = settings
        self.name: str = settings.provider
        self._client = _client(settings)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """One Messages API call (the SDK retries); `LLMError` when it finally fails."""
        options: dict[str, Any] = {
            "model": self.settings.model,
            "max_tokens": request.max_tokens,
            "system": request.system,
            "messages": to_api_messages(request.messages),
        }
        if request.tools:
            options["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in request.tools
            ]
        malformed: Exception | None = None
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                await asyncio.sleep(min(MALFORMED_RETRY_SECONDS * 2 ** (attempt - 1), 8.0))
            try:
                return _response(await self._create(options))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                # A body that is not the Messages API's JSON (a proxy's error page, a cut-off
                # answer): the SDK does not retry these, so this does.
                malformed = exc
                log.warning("llm.malformed_answer", attempt=attempt + 1, error=str(exc)[:200])
        raise LLMError(f"the model API returned a malformed answer: {malformed}")

    async def _create(self, options: dict[str, Any]) -> Any:
        try:
            return await self._client.messages.create(**options)
        except anthropic.APIStatusError as exc:
            raise LLMError(
                f"the model API answered {exc.status_code}: {_api_message(exc)}"
            ) from exc
        except anthropic.APIConnectionError as exc:
            raise LLMError(f"the model API could not be reached: {exc}") from exc
        except anthropic.APIResponseValidationError as exc:
            raise ValueError(f"the answer does not match the Messages API: {exc}") from exc
        except anthropic.APIError as exc:
            raise LLMError(f"the model API failed: {exc}") from exc

    async def close(self) -> None:
        """Close the SDK's connection pool."""
        await self._client.close()


def _response(message: Any) -> LLMResponse:
    blocks = tuple(block.model_dump(mode="json", exclude_none=True) for block in message.content)
    if not blocks and message.stop_reason is None:
        raise LLMError("the model API returned an empty message")
    text = "".join(block.get("text", "") for block in blocks if block.get("type") == "text")
    return LLMResponse(
        text=text,
        input_tokens=message.usage.input_tokens,
        output_tokens=message.usage.output_tokens,
        model=message.model,
        blocks=blocks,
        stop_reason=message.stop_reason or "end_turn",
    )


def _api_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return f"{error.get('type', 'error')}: {error['message']}"
    return str(exc.message)
