"""A fake Anthropic Messages API on a loopback port, for the real `anthropic` SDK.

It records every request body; answers by default like a model would (a reply naming the
last user message; for the engine's bookkeeping calls, the offline provider's extractive
answers in the requested format); and can be scripted to answer the next requests with HTTP
errors (429/529/500, with `retry-after`), tool calls, or after a delay. `latency` delays every
answer that no script entry shapes (a model's thinking time, for load tests).

Run as a process of its own for benchmarks: `python -m tests.fakes.anthropic_api --port N
--latency 2.0` (it then keeps no request bodies).
"""

from __future__ import annotations

import asyncio
import json
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

from sessions.llm import offline_facts, offline_summary, offline_topic
from tests.e2e.harness import free_port
from tests.fakes.threaded import ThreadedServer


@dataclass
class Scripted:
    """One scripted answer: an HTTP error, a tool call, text or a raw (malformed) body;
    optionally after a delay."""

    status: int = 200
    error_type: str = "overloaded_error"
    headers: dict[str, str] = field(default_factory=dict)
    tool_use: dict[str, Any] | None = None
    text: str | None = None
    delay: float = 0.0
    raw: str | None = None  # a body sent as it is (a malformed answer)


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
        # Keep each request body in `requests`; off for long benchmark runs (memory).
        self.record: bool = True
        self._server: ThreadedServer | None = None

    @property
    def replies(self) -> list[dict[str, Any]]:
        """The recorded requests that were turns (not bookkeeping calls)."""
        bookkeeping = ("Summarise", "Extract durable facts", "Describe the topic")
        return [r for r in self.requests if not str(r.get("system", "")).startswith(bookkeeping)]

    async def _messages(self, request: Request) -> Response:
        body = await request.json()
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
        if scripted.tool_use is not None:
            content = [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", **scripted.tool_use},
            ]
            stop_reason = "tool_use"
        else:
            content = [{"type": "text", "text": scripted.text or default_answer(body)}]
        prompt_chars = len(json.dumps(body.get("messages"))) + len(str(body.get("system")))
        return JSONResponse(
            {
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
        )

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


def main() -> None:
    """Serve the fake on `--port` until killed (`python -m tests.fakes.anthropic_api`)."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description="A fake Anthropic Messages API on loopback.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer (0)")
    args = parser.parse_args()
    api = FakeAnthropicAPI()
    api.latency = max(args.latency, 0.0)
    api.record = False
    uvicorn.run(api.app(), host="127.0.0.1", port=args.port, log_config=None, access_log=False)


if __name__ == "__main__":
    main()
