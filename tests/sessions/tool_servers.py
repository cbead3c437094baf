"""Settings for the fake MCP servers of the tool tests: the stdio one started as a process of
its own with its call log in a file, the HTTP one (`tests.fakes.mcp_http`) on loopback."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from sessions.mcp_servers import McpServerSettings

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "fakes" / "mcp_tool_server.py"


def stdio_server(
    name: str, log: Path, *, env: dict[str, str] | None = None, **options: Any
) -> McpServerSettings:
    """The fake server `name` over stdio, logging its calls to `log`."""
    return McpServerSettings(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=(str(SERVER_SCRIPT), name, str(log)),
        env=tuple((env or {}).items()),
        **options,
    )


def http_server(name: str, url: str, **options: Any) -> McpServerSettings:
    """The fake server `name` at `url` over streamable HTTP."""
    return McpServerSettings(name=name, transport="http", url=url, **options)


def logged_calls(log: Path) -> list[tuple[str, dict[str, Any]]]:
    """The calls a stdio server logged, in order."""
    if not log.exists():
        return []
    lines = log.read_text(encoding="utf-8").splitlines()
    return [(entry["tool"], entry["arguments"]) for entry in map(json.loads, lines)]


SHORT = timedelta(seconds=1)
