"""`HttpToolServer`: the fake MCP server's tools (`tests.fakes.mcp_tool_server`) over
streamable HTTP on a loopback port, served by uvicorn on a thread of its own."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from tests.e2e.harness import free_port
from tests.fakes.mcp_tool_server import build_server
from tests.fakes.threaded import ThreadedServer


class _HeaderRecorder:
    """The server's app, noting each HTTP request's headers first."""

    def __init__(self, app: ASGIApp, seen: list[dict[str, str]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


class HttpToolServer:
    """Use as a context manager; `url` is the endpoint, `calls` what reached the tools and
    `headers_seen` the headers of every HTTP request."""

    def __init__(self, name: str = "crm") -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.calls: list[tuple[str, dict[str, object]]] = []
        self.headers_seen: list[dict[str, str]] = []
        app = build_server(name, lambda tool, args: self.calls.append((tool, args)))
        recording = _HeaderRecorder(app.streamable_http_app(), self.headers_seen)
        self._server = ThreadedServer(recording, self.port, f"MCP server {name}", lifespan=True)

    def __enter__(self) -> HttpToolServer:
        self._server.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.stop()
