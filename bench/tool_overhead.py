"""Tool-call overhead: what the gateway's path (`McpToolbox.call`: the policy check, the
server's session, the timeout, the result's text and cap) adds to a call beyond the server's
own time, for a stdio server and a streamable HTTP one (goal: <= 5 ms per call).

Both servers are the fake of the tests (`tests/fakes/mcp_tool_server.py`, written with the
SDK's server side): the stdio one a process of its own, the HTTP one on loopback. For each,
`--calls` calls of `lookup_order` (an instant tool) go through a bare SDK `ClientSession` on
its own connection (the server's own time plus the transport: the baseline) and through the
toolbox, interleaved one by one so that both see the same machine; the overhead is the
difference of the medians (and of the p95s).

    .venv/bin/python bench/tool_overhead.py --calls 500

One JSON object goes to stdout, progress to stderr. Exit code 1 when an overhead's median is
over the goal, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from bench.benchkit import progress, run_and_print_json
from gateway.log import configure_logging
from sessions.mcp_servers import McpServerSettings
from sessions.tool_policy import PolicyRule, ToolPolicy
from sessions.toolbox import McpToolbox, ToolSettings
from tests.fakes.mcp_http import HttpToolServer

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "fakes" / "mcp_tool_server.py"
GOAL_MS = 5.0


@contextlib.asynccontextmanager
async def bare_session(settings: McpServerSettings) -> AsyncIterator[ClientSession]:
    """The SDK alone, on a connection of its own to the same server."""
    if settings.transport == "stdio":
        transport: Any = stdio_client(
            StdioServerParameters(command=settings.command, args=list(settings.args))
        )
    else:
        transport = streamable_http_client(settings.url)
    async with transport as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


async def measure_server(settings: McpServerSettings, calls: int) -> dict[str, Any]:
    box = McpToolbox(
        ToolSettings(
            servers=(settings,), policy=ToolPolicy((PolicyRule(orgs=("*",), allow=("*",)),))
        )
    )
    await box.start()
    name = f"{settings.name}__lookup_order"
    bare_ms: list[float] = []
    toolbox_ms: list[float] = []
    try:
        async with bare_session(settings) as session:
            for index in range(calls + 20):  # the first 20 of each warm up
                arguments = {"order_id": f"O-{index}"}
                bare = await timed(lambda a=arguments: session.call_tool("lookup_order", a))
                ours = await timed(
                    lambda a=arguments: box.call(name, a, org_id="acme", user_id="alice")
                )
                if index >= 20:
                    bare_ms.append(bare)
                    toolbox_ms.append(ours)
    finally:
        await box.close()
    figures = {
        "bare_sdk_ms": {
            "p50": round(statistics.median(bare_ms), 3),
            "p95": round(percentile(bare_ms, 0.95), 3),
        },
        "toolbox_ms": {
            "p50": round(statistics.median(toolbox_ms), 3),
            "p95": round(percentile(toolbox_ms, 0.95), 3),
        },
    }
    figures["overhead_ms"] = {
        key: round(figures["toolbox_ms"][key] - figures["bare_sdk_ms"][key], 3)
        for key in ("p50", "p95")
    }
    return figures


async def measure(calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder, HttpToolServer("crm") as crm:
        stdio = McpServerSettings(
            name="orders",
            transport="stdio",
            command=sys.executable,
            args=(str(SERVER_SCRIPT), "orders", str(Path(folder) / "orders.log")),
        )
        http = McpServerSettings(name="crm", transport="http", url=crm.url)
        progress(f"stdio: {calls} calls each way")
        stdio_figures = await measure_server(stdio, calls)
        progress(f"http: {calls} calls each way")
        http_figures = await measure_server(http, calls)
    return {"calls": calls, "goal_ms": GOAL_MS, "stdio": stdio_figures, "http": http_figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    # Every call logs `tools.called` at info; only the figures go to stdout. The HTTP
    # server's own error lines when a client hangs up are not ours (critical: left out).
    configure_logging("console", "warning")
    logging.getLogger("mcp.server.streamable_http").setLevel(logging.CRITICAL)

    def verdict(figures: dict[str, Any]) -> int:
        over = [
            transport
            for transport in ("stdio", "http")
            if figures[transport]["overhead_ms"]["p50"] > GOAL_MS
        ]
        return 1 if over else 0

    return run_and_print_json(lambda: asyncio.run(measure(args.calls)), verdict)


if __name__ == "__main__":
    sys.exit(main())
