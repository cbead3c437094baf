"""One MCP server the assistant may use, kept connected: `McpServer`.

Built on the official `mcp` SDK's v1 client (`stdio_client` / `streamable_http_client`, then
`ClientSession`: `initialize`, `list_tools`, `call_tool`). The SDK's connections are async
context managers whose task groups must be left by the task that entered them, so each
server has one task of its own that connects, lists the tools, and holds the session open
until it is stopped or fails; calls from turns go through that session concurrently.

A stdio server is started once per process and runs with only the environment its config
declares (started through ``env -i``: the SDK would otherwise pass on HOME, PATH, USER and
others). When a server fails (it cannot be started or reached, its process exits, a call finds
the connection closed), only its own tools go away: the failure is logged, and the task
connects and lists again after a pause that doubles up to `MAX_RETRY_SECONDS`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TextIO

import anyio
import httpx
import structlog
from mcp import ClientSession, McpError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import (
    CONNECTION_CLOSED,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    Tool,
)

from errors import ToolError
from sessions.tool_policy import matches_any

log = structlog.stdlib.get_logger(__name__)

ENV_PROGRAM = "/usr/bin/env"
STOP_WAIT_SECONDS = 5.0
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 60.0
TOOL_SEPARATOR = "__"

ServerState = Literal["starting", "ready", "failed", "stopped"]


@dataclass(frozen=True, slots=True)
class McpServerSettings:
    """How to reach one server and what of it the model may see (`gateway.tools_settings`)."""

    name: str
    transport: Literal["stdio", "http"]
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    timeout: timedelta = timedelta(seconds=30)
    max_result_chars: int = 20_000
    expose: tuple[str, ...] = ("*",)
    confirm: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerTool:
    """A tool a server listed (and its config exposes), under its name on the server."""

    name: str
    description: str
    input_schema: dict[str, Any]
    confirm: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallResult:
    """What a call returned: its text (cut at the server's cap) and whether it is an error."""

    text: str
    is_error: bool = False
    truncated: bool = False


def qualified_name(server: str, tool: str) -> str:
    """The name the model sees: ``server__tool``."""
    return f"{server}{TOOL_SEPARATOR}{tool}"


def result_text(result: CallToolResult) -> str:
    """A call's content as text: text blocks as they are, other blocks named; the structured
    content when there is no text."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ImageContent):
            parts.append(f"[image {block.mimeType}]")
        elif isinstance(block, EmbeddedResource):
            parts.append(f"[resource {block.resource.uri}]")
        else:
            parts.append(f"[{block.type}]")
    if not parts and result.structuredContent is not None:
        parts.append(json.dumps(result.structuredContent, ensure_ascii=False))
    return "\n".join(parts)


def capped(text: str, max_chars: int) -> tuple[str, bool]:
    """`text` cut at `max_chars` (with a note saying so), and whether it was cut."""
    if len(text) <= max_chars:
        return text, False
    dropped = len(text) - max_chars
    return f"{text[:max_chars]}\n[result cut: {dropped} more characters not shown]", True


class McpServer:
    """A connection to one MCP server, its listed tools and its calls."""

    def __init__(self, settings: McpServerSettings, *, errlog: TextIO | None = None) -> None:
        self.settings = settings
        self.state: ServerState = "stopped"
        self.error = ""
        self.tools: tuple[ServerTool, ...] = ()
        self._errlog = errlog
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._reconnect = asyncio.Event()
        self._stopping = False
        # The session is being left on purpose: errors of closing it are no failure.
        self._leaving = False
        self._settled = asyncio.Event()  # ready or failed (once per connection attempt)

    @property
    def name(self) -> str:
        """The server's configured name."""
        return self.settings.name

    async def start(self, *, wait: float) -> None:
        """Start connecting in the background; wait up to `wait` seconds for the first
        attempt to succeed or fail (a slow server goes on connecting after that)."""
        if self._task is not None:
            return
        self.state = "starting"
        self._task = asyncio.create_task(self._run(), name=f"mcp-{self.name}")
        try:
            async with asyncio.timeout(wait):
                await self._settled.wait()
        except TimeoutError:
            log.warning("tools.server_slow", server=self.name, waited=wait)

    async def stop(self) -> None:
        """Disconnect (a stdio server's process is ended)."""
        task, self._task = self._task, None
        if task is not None:
            # Leaving the SDK's contexts in their own task closes them properly; cancelling
            # is the last resort (a cancellation inside them can be absorbed by their scopes).
            self._stopping = True
            self._reconnect.set()
            try:
                async with asyncio.timeout(STOP_WAIT_SECONDS):
                    await asyncio.gather(task, return_exceptions=True)
            except TimeoutError:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._session = None
        self.tools = ()
        self.state = "stopped"

    def reconnect(self) -> None:
        """Connect and list the tools again (when a call found the connection broken)."""
        self._reconnect.set()

    async def relist(self) -> None:
        """List the tools again on the open session (after a reload: the server may have
        changed them); a server that is down is left to its reconnection."""
        session = self._session
        if session is None or self.state != "ready":
            return
        try:
            async with asyncio.timeout(self.settings.timeout.total_seconds()):
                listed = await session.list_tools()
        except (
            TimeoutError,
            McpError,
            anyio.ClosedResourceError,
            anyio.BrokenResourceError,
        ) as exc:
            self._broken(_describe(exc))
            return
        self.tools = self._exposed(listed.tools)
        log.info("tools.server_relisted", server=self.name, tools=[t.name for t in self.tools])

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolCallResult:
        """Call `tool` (its name on this server) within the server's timeout; `ToolError`
        when the server is unavailable, the call times out or the connection breaks."""
        session = self._session
        if session is None or self.state != "ready":
            raise ToolError(f"the tool server {self.name!r} is unavailable", key=self.name)
        timeout = self.settings.timeout.total_seconds()
        try:
            # The SDK's own read timeout answers a request that outlives it; the outer one
            # also bounds a session stuck before the request is sent.
            async with asyncio.timeout(timeout + 1.0):
                result = await session.call_tool(
                    tool, arguments, read_timeout_seconds=self.settings.timeout
                )
        except TimeoutError:
            raise ToolError(
                f"{qualified_name(self.name, tool)} timed out after {timeout:g}s", key=self.name
            ) from None
        except McpError as exc:
            if exc.error.code == httpx.codes.REQUEST_TIMEOUT:  # the SDK's read timeout
                raise ToolError(
                    f"{qualified_name(self.name, tool)} timed out after {timeout:g}s",
                    key=self.name,
                ) from exc
            if exc.error.code == CONNECTION_CLOSED:
                self._broken(str(exc))
            raise ToolError(f"the tool server answered: {exc}", key=self.name) from exc
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, httpx.HTTPError) as exc:
            self._broken(repr(exc))
            raise ToolError(f"the tool server {self.name!r} is unavailable", key=self.name) from exc
        text, truncated = capped(result_text(result), self.settings.max_result_chars)
        return ToolCallResult(text, is_error=result.isError, truncated=truncated)

    def _broken(self, reason: str) -> None:
        if self.state == "ready":
            self.state = "failed"
            self.error = reason
            self.tools = ()
            log.error("tools.server_failed", server=self.name, error=reason)
        self._reconnect.set()

    async def _run(self) -> None:
        pause = FIRST_RETRY_SECONDS
        while not self._stopping:
            self._reconnect.clear()
            self._leaving = False
            try:
                await self._serve()
            except Exception as exc:  # noqa: BLE001 (a server fails in many ways: a process that cannot start, a refused connection, a protocol error, the SDK's exception groups; each one disables only this server)
                self._session = None
                self.tools = ()
                if not self._leaving:
                    self.state = "failed"
                    self.error = _describe(exc)
                    log.error("tools.server_failed", server=self.name, error=self.error)
            if self._stopping:
                return
            if self._leaving:
                pause = FIRST_RETRY_SECONDS
                continue  # asked to reconnect: at once
            self._settled.set()
            try:
                async with asyncio.timeout(pause):
                    await self._reconnect.wait()
            except TimeoutError:
                pass
            pause = min(pause * 2, MAX_RETRY_SECONDS)

    async def _serve(self) -> None:
        """Connect, list, and hold the session until asked to reconnect."""
        async with self._transport() as streams, ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            listed = await session.list_tools()
            self.tools = self._exposed(listed.tools)
            self._session = session
            self.state = "ready"
            self.error = ""
            self._settled.set()
            log.info(
                "tools.server_ready",
                server=self.name,
                tools=[tool.name for tool in self.tools],
                listed=len(listed.tools),
            )
            try:
                await self._reconnect.wait()
            finally:
                self._leaving = True
                self._session = None

    def _exposed(self, listed: list[Tool]) -> tuple[ServerTool, ...]:
        settings = self.settings
        return tuple(
            ServerTool(
                tool.name,
                tool.description or "",
                dict(tool.inputSchema),
                confirm=matches_any(tool.name, settings.confirm),
            )
            for tool in listed
            if matches_any(tool.name, settings.expose)
        )

    def _transport(self) -> Any:
        settings = self.settings
        if settings.transport == "stdio":
            # `env -i`: the server gets exactly the declared variables, nothing inherited.
            params = StdioServerParameters(
                command=ENV_PROGRAM,
                args=[
                    "-i",
                    "--",
                    *(f"{name}={value}" for name, value in settings.env),
                    settings.command,
                    *settings.args,
                ],
                env={},
            )
            return stdio_client(params, errlog=self._errlog or sys.stderr)
        client = httpx.AsyncClient(
            headers=dict(settings.headers),
            timeout=httpx.Timeout(settings.timeout.total_seconds(), read=300.0),
        )
        return _http_transport(settings.url, client)


class _http_transport:  # noqa: N801 (used like the SDK's context-manager functions)
    """`streamable_http_client` with our own `httpx` client, closed with it."""

    def __init__(self, url: str, client: httpx.AsyncClient) -> None:
        self._client = client
        self._inner = streamable_http_client(url, http_client=client)

    async def __aenter__(self) -> Any:
        await self._client.__aenter__()
        try:
            return await self._inner.__aenter__()
        except BaseException:
            await self._client.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self._inner.__aexit__(*exc)
        finally:
            await self._client.__aexit__(None, None, None)


def _describe(exc: BaseException) -> str:
    """The innermost meaningful message of a failure (exception groups unwrapped)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:300]
