"""A fake Anthropic Messages API on a loopback port, for the real `anthropic` SDK.

It records every request body; answers by default like a model would (a reply naming the
last user message; for the engine's bookkeeping calls, the offline provider's extractive
answers in the requested format); and can be scripted to answer the next requests with HTTP
errors (429/529/500, with `retry-after`), tool calls, or after a delay. `latency` delays every
answer that no script entry shapes (a model's thinking time, for load tests), and
`answer_words` makes every unscripted turn's answer that many words long (the default answer,
filler prose and `ANSWER_END`: long answers for streaming benchmarks, whose end a reader can
recognise; bookkeeping answers are unchanged).

A request with `"stream": true` gets the same answer as the Messages API's server-sent events
(`message_start`, `ping`, `content_block_start`/`_delta`/`_stop` for text, one word a delta,
and for tool calls with `input_json_delta`, `message_delta` with the stop reason and usage,
`message_stop`), `token_interval` seconds between two text deltas. A script entry can break
such a stream after some words: an `error` event (`stream_error`, e.g. `overloaded_error`) or
a dropped connection (`drop_stream`). Every event sent is recorded in `sent` with the
`time.monotonic()` it left, so a test can tell what the client had before the stream ended.

Run as a process of its own for benchmarks: `python -m tests.fakes.anthropic_api --port N
--latency 2.0 --token-interval 0.02 --words 150` (it then keeps no request bodies and no
events).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sessions.anthropic_llm import AnthropicLLM, AnthropicSettings
from sessions.llm import offline_facts, offline_summary, offline_topic, word_tokens
from tests.e2e.harness import free_port
from tests.fakes.threaded import ThreadedServer


@dataclass
class Scripted:
    """One scripted answer: an HTTP error, a tool call, text or a raw (malformed) body;
    optionally after a delay. For a streamed request, optionally a stream that breaks after
    `fail_after_tokens` text deltas, with an `error` event of type `stream_error` or a
    dropped connection (`drop_stream`); a request that does not stream ignores these."""

    status: int = 200
    error_type: str = "overloaded_error"
    headers: dict[str, str] = field(default_factory=dict)
    tool_use: dict[str, Any] | None = None
    # Several tool calls in one answer (the model asks for them side by side).
    tool_uses: tuple[dict[str, Any], ...] = ()
    text: str | None = None
    delay: float = 0.0
    raw: str | None = None  # a body sent as it is (a malformed answer)
    stream_error: str | None = None
    drop_stream: bool = False
    fail_after_tokens: int = 1
    token_interval: float | None = None  # this answer's pace (default: the server's)

    @property
    def breaks_stream(self) -> bool:
        """Whether a streamed answer to this entry stops before its end."""
        return self.stream_error is not None or self.drop_stream


@dataclass(frozen=True, slots=True)
class SentEvent:
    """One server-sent event as it left the fake: the request it answered (its number among
    all requests, from 0), the event's name, when it was handed to the connection
    (`time.monotonic()`, just before the write), and a text delta's text."""

    request: int
    name: str
    at: float
    text: str = ""


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if block.get("type") == "text":
            parts.append(block["text"])
        elif block.get("type") == "tool_result":
            parts.append(f"[tool result: {block.get('content')}]")
    return "\n".join(parts)


def default_answer(body: dict[str, Any]) -> str:
    """What the fake model says when nothing is scripted."""
    system = body.get("system") or ""
    if isinstance(system, list):
        system = " ".join(block.get("text", "") for block in system)
    last = _text_of(body["messages"][-1]["content"]) if body.get("messages") else ""
    if system.startswith("Summarise the conversation below"):
        return offline_summary(last, max_chars=int(body.get("max_tokens", 1000)) * 4)
    if system.startswith("Summarise this conversation"):
        return offline_summary(last, max_chars=2000)
    if system.startswith("Extract durable facts"):
        return json.dumps(offline_facts(last))
    if system.startswith("Describe the topic"):
        return json.dumps(offline_topic(last))
    return f"Claude here. You said: {last[:200]}"


BOOKKEEPING_PREFIXES = ("Summarise", "Extract durable facts", "Describe the topic")
FILLER = (
    "Streaming shows the answer while it is written, so the reader starts at once instead "
    "of waiting for the whole reply to arrive in one piece."
)


def is_bookkeeping(body: dict[str, Any]) -> bool:
    """Whether a request is one of the engine's bookkeeping calls rather than a turn."""
    system = body.get("system") or ""
    if isinstance(system, list):
        system = " ".join(block.get("text", "") for block in system)
    return str(system).startswith(BOOKKEEPING_PREFIXES)


ANSWER_END = "End of answer."


def padded(text: str, words: int) -> str:
    """`text`, filler words and `ANSWER_END` (so that a reader can tell the whole answer from
    a part of it), `words` words in all (more when `text` alone is longer)."""
    missing = max(words - len(text.split()) - len(ANSWER_END.split()), 0)
    words_of_filler = FILLER.split()
    filler = [words_of_filler[index % len(words_of_filler)] for index in range(missing)]
    return " ".join([text, *filler, ANSWER_END])


def stream_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A Messages API answer as the API streams it: (event name, data) in order."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        events += _block_events(index, block)
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _block_events(index: int, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One content block's start, deltas (a word, or a piece of the tool input's JSON, each)
    and stop."""
    if block["type"] == "text":
        opening: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": token} for token in word_tokens(block["text"])]
    else:
        opening = {**block, "input": {}}
        encoded = json.dumps(block["input"])
        pieces = [encoded[i : i + 8] for i in range(0, len(encoded), 8)]
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
    return [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        ),
        *(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


class EventStreamResponse(Response):
    """Server-sent events paced like a model writing, recorded as they leave, and broken off
    where the script says (an `error` event, or the connection dropped without the end of
    the body)."""

    def __init__(
        self,
        api: FakeAnthropicAPI,
        number: int,
        events: list[tuple[str, dict[str, Any]]],
        scripted: Scripted,
    ) -> None:
        super().__init__(media_type="text/event-stream", headers={"cache-control": "no-cache"})
        # The body's length is not known in advance: chunked, as the API sends it.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.api = api
        self.number = number
        self.events = events
        self.scripted = scripted
        interval = scripted.token_interval
        self.interval = api.token_interval if interval is None else interval

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the events; a broken stream ends here without finishing the body."""
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        tokens = 0
        for name, data in self.events:
            if self.scripted.breaks_stream and (
                tokens >= self.scripted.fail_after_tokens or name == "message_delta"
            ):
                if self.scripted.drop_stream:
                    self.api.record_event(self.number, "dropped")
                    return  # uvicorn closes the connection: the body never ends
                error = {"type": self.scripted.stream_error, "message": "scripted"}
                await self._send("error", {"type": "error", "error": error}, send)
                break
            text = data["delta"].get("text", "") if name == "content_block_delta" else ""
            if text:
                if tokens and self.interval > 0:
                    await asyncio.sleep(self.interval)
                tokens += 1
            await self._send(name, data, send, text=text)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send(self, name: str, data: dict[str, Any], send: Send, *, text: str = "") -> None:
        chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        # Recorded first: once the client has an event, its record exists.
        self.api.record_event(self.number, name, text)
        await send({"type": "http.response.body", "body": chunk, "more_body": True})


class FakeAnthropicAPI:
    """The server; use as a context manager. `url` is the SDK's `base_url`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[dict[str, Any]] = []
        self.script: deque[Scripted] = deque()
        self.on_request: Callable[[dict[str, Any]], None] | None = None
        self.bedrock_models: list[str] = []
        # Seconds every unscripted answer waits (a scripted one waits its own `delay`).
        self.latency: float = 0.0
        # Seconds between two text deltas of a streamed answer.
        self.token_interval: float = 0.0
        # Words of every unscripted turn's answer (None: the default answer as it is).
        self.answer_words: int | None = None
        # Keep each request body in `requests` and each event in `sent`; off for long
        # benchmark runs (memory).
        self.record: bool = True
        self.sent: list[SentEvent] = []
        self._count = 0
        self._server: ThreadedServer | None = None

    def record_event(self, request: int, name: str, text: str = "") -> None:
        """Note that an event of request number `request` left now."""
        if self.record:
            self.sent.append(SentEvent(request, name, time.monotonic(), text))

    def sent_to(self, request: int) -> list[SentEvent]:
        """The events sent in answer to request number `request`."""
        return [event for event in self.sent if event.request == request]

    @property
    def replies(self) -> list[dict[str, Any]]:
        """The recorded requests that were turns (not bookkeeping calls)."""
        bookkeeping = ("Summarise", "Extract durable facts", "Describe the topic")
        return [r for r in self.requests if not str(r.get("system", "")).startswith(bookkeeping)]

    async def _messages(self, request: Request) -> Response:
        body = await request.json()
        number = self._count
        self._count += 1
        if self.record:
            self.requests.append(body)
        if self.on_request is not None:
            self.on_request(body)
        delay = self.latency
        if self.script:
            scripted = self.script.popleft()
            delay = scripted.delay
        else:
            scripted = Scripted()
        if delay:
            await asyncio.sleep(delay)
        if scripted.raw is not None:
            return Response(scripted.raw, media_type="application/json")
        if scripted.status != 200:
            return JSONResponse(
                {"type": "error", "error": {"type": scripted.error_type, "message": "scripted"}},
                status_code=scripted.status,
                headers=scripted.headers,
            )
        content: list[dict[str, Any]]
        stop_reason = "end_turn"
        uses = [scripted.tool_use] if scripted.tool_use is not None else list(scripted.tool_uses)
        if uses:
            content = [
                {"type": "text", "text": "Let me check."},
                *(
                    {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", **use}
                    for use in uses
                ),
            ]
            stop_reason = "tool_use"
        else:
            content = [{"type": "text", "text": scripted.text or self._answer(body)}]
        prompt_chars = len(json.dumps(body.get("messages"))) + len(str(body.get("system")))
        message = {
            "id": f"msg_{uuid.uuid4().hex[:16]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-test"),
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt_chars // 4,
                "output_tokens": len(json.dumps(content)) // 4,
            },
        }
        if body.get("stream"):
            return EventStreamResponse(self, number, stream_events(message), scripted)
        return JSONResponse(message)

    def _answer(self, body: dict[str, Any]) -> str:
        """The unscripted answer: the default one, padded to `answer_words` for a turn."""
        answer = default_answer(body)
        if self.answer_words is None or is_bookkeeping(body):
            return answer
        return padded(answer, self.answer_words)

    async def _bedrock_invoke(self, request: Request) -> Response:
        # Bedrock's InvokeModel takes the Messages API body without `model` (it is in the path).
        self.bedrock_models.append(request.path_params["model"])
        return await self._messages(request)

    async def _models(self, _request: Request) -> Response:
        model = {
            "type": "model",
            "id": "claude-sonnet-5-5",
            "display_name": "Claude Sonnet",
            "created_at": "2026-01-01T00:00:00Z",
        }
        return JSONResponse(
            {"data": [model], "has_more": False, "first_id": model["id"], "last_id": model["id"]}
        )

    def app(self) -> Starlette:
        """The ASGI app: `/v1/messages`, `/v1/models` and Bedrock's `/model/{model}/invoke`."""
        return Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/model/{model}/invoke", self._bedrock_invoke, methods=["POST"]),
            ]
        )

    def __enter__(self) -> FakeAnthropicAPI:
        self._server = ThreadedServer(self.app(), self.port, "fake Anthropic API")
        self._server.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._server is not None:
            self._server.stop()


def claude(api: FakeAnthropicAPI, **settings: Any) -> AnthropicLLM:
    """The real Anthropic client pointed at the fake (settings overridden by keyword)."""
    values: dict[str, Any] = {
        "provider": "anthropic",
        "model": "claude-sonnet-5-5",
        "api_key": "k",
        "base_url": api.url,
        **settings,
    }
    return AnthropicLLM(AnthropicSettings(**values))


def main() -> None:
    """Serve the fake on `--port` until killed (`python -m tests.fakes.anthropic_api`)."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description="A fake Anthropic Messages API on loopback.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer (0)")
    parser.add_argument(
        "--token-interval",
        type=float,
        default=0.0,
        help="seconds between two words of a streamed answer (0)",
    )
    parser.add_argument(
        "--words", type=int, default=None, help="words of every turn's answer (the default one)"
    )
    args = parser.parse_args()
    api = FakeAnthropicAPI()
    api.latency = max(args.latency, 0.0)
    api.token_interval = max(args.token_interval, 0.0)
    api.answer_words = args.words
    api.record = False
    uvicorn.run(api.app(), host="127.0.0.1", port=args.port, log_config=None, access_log=False)


if __name__ == "__main__":
    main()
