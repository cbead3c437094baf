"""The `LLMClient` on Anthropic's SDK: the Messages API directly, on Bedrock, or on Vertex.

Retries are the SDK's own for the request itself: exponential backoff on 408/409/429/5xx
(529 "overloaded" included) and connection errors, honouring `retry-after`; timeouts per
request. What still fails after `max_retries` becomes an `LLMError` carrying the status and
the API's message.

With a `TurnProgress` the call streams and each text delta goes to the progress as it
arrives (the events read by `sessions.anthropic_stream`; on Bedrock the SDK's
`messages.stream`). The SDK retries only the request that opens a stream: a stream that
breaks off later (an `error` event such as `overloaded_error`, a dropped connection, a stream
that ends before `message_stop`) is started again here, up to `max_retries` times with
backoff, after `progress.reset()` so the text shown starts over. Answers that are not the
Messages API's shape are retried the same way, streamed or not.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anthropic
import httpx2
import structlog

from errors import LLMError
from sessions.anthropic_stream import StreamedMessage, StreamError, server_sent_events
from sessions.llm import ContentBlock, LLMMessage, LLMRequest, LLMResponse
from sessions.progress import TurnProgress

log = structlog.stdlib.get_logger(__name__)

MALFORMED_RETRY_SECONDS = 0.5
"""The first pause before calling again after a malformed answer or a broken stream
(doubling each time, at most `MAX_RETRY_SECONDS`)."""
MAX_RETRY_SECONDS = 8.0

RETRYABLE_STREAM_ERRORS = frozenset(
    {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}
)
"""`error` events of a stream worth starting again (the API's transient errors)."""

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
        # The SDK's aiohttp transport (its `aiohttp` extra): a streamed call cost 0.86-0.87
        # CPU-ms through it against 1.38-1.65 through the default httpx/httpcore/h11 stack
        # (the same fake API on loopback, 600 calls). Errors still come as httpx's.
        "http_client": anthropic.DefaultAioHttpClient(timeout=settings.timeout_seconds),
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


class _RetryableError(Exception):
    """A call that may succeed when made again: a malformed answer or a broken stream."""


class AnthropicLLM:
    """Completions from Claude through the `anthropic` SDK."""

    def __init__(self, settings: AnthropicSettings) -> None:
        self.settings = settings
        self.name: str = settings.provider
        self._client = _client(settings)

    async def complete(
        self, request: LLMRequest, *, progress: TurnProgress | None = None
    ) -> LLMResponse:
        """One Messages API call (the SDK retries the request; malformed answers and broken
        streams are retried here); `LLMError` when it finally fails. Streams into
        `progress` when given."""
        options = self._options(request)
        failure: _RetryableError | None = None
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                if progress is not None:
                    progress.reset()
                await asyncio.sleep(
                    min(MALFORMED_RETRY_SECONDS * 2 ** (attempt - 1), MAX_RETRY_SECONDS)
                )
            try:
                if progress is None:
                    return await self._create(options)
                return await self._stream(options, progress)
            except _RetryableError as exc:
                failure = exc
                log.warning(
                    "llm.call_retried",
                    attempt=attempt + 1,
                    streamed=progress is not None,
                    error=str(exc)[:200],
                )
        raise LLMError(str(failure))

    def _options(self, request: LLMRequest) -> dict[str, Any]:
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
        return options

    async def _create(self, options: dict[str, Any]) -> LLMResponse:
        try:
            return _response(await self._client.messages.create(**options))
        except anthropic.APIStatusError as exc:
            raise _status_error(exc) from exc
        except anthropic.APIConnectionError as exc:
            raise LLMError(f"the model API could not be reached: {exc}") from exc
        except anthropic.APIResponseValidationError as exc:
            raise _malformed(exc) from exc
        except anthropic.APIError as exc:
            raise LLMError(f"the model API failed: {exc}") from exc
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # A body that is not the Messages API's JSON (a proxy's error page, a cut-off
            # answer): the SDK does not retry these, so `complete` does.
            raise _malformed(exc) from exc

    async def _stream(self, options: dict[str, Any], progress: TurnProgress) -> LLMResponse:
        """One streamed call: text deltas into `progress`, the response from the final
        message. Errors of the opening request are final (the SDK has retried them); a
        stream that breaks off afterwards is `_RetryableError` when trying again may help."""
        opened = False
        try:
            if self.settings.provider == "anthropic":
                # Server-sent events, read without the SDK's per-event objects
                # (`sessions.anthropic_stream`); Bedrock's streams are AWS event streams.
                request = self._client.messages.with_streaming_response.create
                async with request(**options, stream=True) as response:
                    opened = True
                    return await _read_events(response.iter_lines(), progress)
            async with self._client.messages.stream(**options) as stream:
                opened = True
                finished = False
                async for event in stream:
                    if event.type == "text":
                        progress.text(event.text)
                    elif event.type == "message_stop":
                        finished = True
                if not finished:
                    raise _RetryableError("the model API's stream ended before message_stop")
                return _response(await stream.get_final_message())
        except StreamError as exc:
            message = f"the model API's stream failed: {exc}"
            if exc.error_type in RETRYABLE_STREAM_ERRORS:
                raise _RetryableError(message) from exc
            raise LLMError(message) from exc
        except anthropic.APIStatusError as exc:
            if opened:
                raise _stream_error(exc) from exc
            raise _status_error(exc) from exc
        except (anthropic.APIConnectionError, httpx2.TransportError) as exc:
            if opened:
                raise _RetryableError(f"the model API's stream broke off: {exc!r}") from exc
            raise LLMError(f"the model API could not be reached: {exc}") from exc
        except anthropic.APIResponseValidationError as exc:
            raise _malformed(exc) from exc
        except anthropic.APIError as exc:
            raise LLMError(f"the model API failed: {exc}") from exc
        except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:
            # Events out of order, tool input that is not JSON, a body that is no stream.
            raise _malformed(exc) from exc

    async def close(self) -> None:
        """Close the SDK's connection pool."""
        await self._client.close()


async def _read_events(lines: AsyncIterator[str], progress: TurnProgress) -> LLMResponse:
    """The message of a stream's events, its text deltas passed to `progress` on arrival."""
    message = StreamedMessage()
    # Read to the end of the body (the API ends it after `message_stop`): a response left
    # unread closes its connection instead of returning it to the pool.
    async for _name, data in server_sent_events(lines):
        if not message.finished and (text := message.feed(json.loads(data))):
            progress.text(text)
    if not message.finished:
        raise _RetryableError("the model API's stream ended before message_stop")
    response = message.response()
    if not response.blocks and message.stop_reason is None:
        raise LLMError("the model API returned an empty message")
    return response


def _status_error(exc: anthropic.APIStatusError) -> LLMError:
    return LLMError(f"the model API answered {exc.status_code}: {_api_message(exc)}")


def _stream_error(exc: anthropic.APIStatusError) -> Exception:
    """An `error` event in an open stream: worth another call when it is transient."""
    message = f"the model API's stream failed: {_api_message(exc)}"
    if _error_type(exc) in RETRYABLE_STREAM_ERRORS:
        return _RetryableError(message)
    return LLMError(message)


def _malformed(exc: Exception) -> _RetryableError:
    return _RetryableError(f"the model API returned a malformed answer: {exc}")


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


def _error_type(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("type", "")) if isinstance(error, dict) else ""


def _api_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return f"{error.get('type', 'error')}: {error['message']}"
    return str(exc.message)
