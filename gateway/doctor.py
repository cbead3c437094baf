"""`gateway doctor --config F`: check what the gateway depends on and print a pass/fail table.

Checks, each with a time limit: the database (reachable, migrations applied), the transcript
store (writable), each enabled channel's own checks (its plugin's `doctor`: the outbound SMTP
server, Slack's `auth.test`, the Teams token endpoint), the Anthropic API (when a provider
other than the offline one is configured) and each MCP server of ``tools:`` (started or
connected, its exposed tools listed). Exit code 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from channels.plugin import CheckSkippedError
from channels.registry import channel_plugins
from gateway.open_services import open_transcript_store
from gateway.runtime_settings import tool_settings
from gateway.settings import GatewayConfig
from sessions.mcp_servers import McpServer, McpServerSettings, qualified_name
from storage.database import Database

CHECK_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check: its name, whether it passed, what it found, how long it took."""

    name: str
    status: str  # pass | fail | skip
    detail: str
    seconds: float

    def as_dict(self) -> dict[str, object]:
        """The result as JSON data."""
        return {
            "check": self.name,
            "status": self.status,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
        }


async def run_checks(config: GatewayConfig) -> list[CheckResult]:
    """Every check, one after the other (each bounded by `CHECK_TIMEOUT_SECONDS`)."""
    checks: list[tuple[str, Callable[[], Awaitable[str]]]] = [
        ("database", lambda: check_database(config)),
        ("transcript store", lambda: check_transcripts(config)),
        *channel_checks(config),
        ("anthropic api", lambda: check_anthropic(config)),
        *mcp_server_checks(config),
    ]
    results = []
    for name, check in checks:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                detail = await check()
            status = "pass"
        except CheckSkippedError as exc:
            status, detail = "skip", str(exc)
        except TimeoutError:
            status, detail = "fail", f"no answer within {CHECK_TIMEOUT_SECONDS:.0f}s"
        except Exception as exc:  # noqa: BLE001 (a doctor reports every failure, whatever it is)
            status, detail = "fail", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        results.append(CheckResult(name, status, detail, time.perf_counter() - started))
    return results


async def check_database(config: GatewayConfig) -> str:
    """Reachable, and at the newest migration."""
    database = Database(config.storage.database_url, pool_size=1)
    try:
        await database.ping()
        current = await database.current_revision()
        head = database.head_revision()
    finally:
        await database.dispose()
    behind = current is None or current in database.known_revisions()
    if current != head and behind and config.storage.auto_migrate:
        # `gateway run` migrates it before it serves (a fresh checkout has no database yet).
        return f"{database.display_url} at revision {current}; `gateway run` migrates it to {head}"
    if current != head:
        raise RuntimeError(
            f"{database.display_url} is at revision {current}, not {head}: run `gateway db upgrade`"
        )
    return f"{database.display_url} at revision {current}"


async def check_transcripts(config: GatewayConfig) -> str:
    """The store answers and accepts a write (`TranscriptStore.check`)."""
    store = await asyncio.to_thread(open_transcript_store, config.storage.transcripts)
    try:
        await store.check()
    finally:
        await store.close()
    settings = config.storage.transcripts
    return f"s3://{settings.s3.bucket}" if settings.backend == "s3" else str(settings.local_path)


def channel_checks(config: GatewayConfig) -> list[tuple[str, Callable[[], Awaitable[str]]]]:
    """Each channel's own checks (its plugin's `doctor`), skipped when the channel is off."""
    checks: list[tuple[str, Callable[[], Awaitable[str]]]] = []
    for plugin in channel_plugins():
        section = config.channels.section(plugin.name)
        for check in plugin.doctor:
            if plugin.enabled(section):
                checks.append((check.name, functools.partial(check.run, section)))
            else:
                checks.append(
                    (check.name, functools.partial(_skip, f"the {plugin.title} channel is off"))
                )
    return checks


async def _skip(reason: str) -> str:
    raise CheckSkippedError(reason)


async def check_anthropic(config: GatewayConfig) -> str:
    """The Anthropic API answers with the configured key (lists one model)."""
    llm = config.llm
    provider = llm.provider
    if provider == "auto":
        provider = "anthropic" if llm.api_key.get_secret_value() else "offline"
    if provider == "offline":
        raise CheckSkippedError("the offline provider needs no network")
    if provider != "anthropic":
        raise CheckSkippedError(f"{provider}: use the cloud's own tools to check access")
    import anthropic  # noqa: PLC0415

    client = anthropic.AsyncAnthropic(
        api_key=llm.api_key.get_secret_value(), base_url=llm.base_url, max_retries=0
    )
    try:
        page = await client.models.list(limit=1)
    finally:
        await client.close()
    first = page.data[0].id if page.data else "no models"
    return f"{llm.base_url or 'api.anthropic.com'} answers ({first})"


def mcp_server_checks(config: GatewayConfig) -> list[tuple[str, Callable[[], Awaitable[str]]]]:
    """One check per declared MCP server, skipped when the server is not enabled."""
    enabled = {server.name: server for server in tool_settings(config.tools).servers}
    return [
        (
            f"mcp server {server.name}",
            functools.partial(check_mcp_server, enabled[server.name])
            if server.name in enabled
            else functools.partial(_skip, "not enabled"),
        )
        for server in config.tools.mcp_servers
    ]


async def check_mcp_server(settings: McpServerSettings) -> str:
    """The server starts (stdio) or answers (http) and lists its tools; the exposed ones."""
    server = McpServer(settings)
    try:
        await server.start(wait=CHECK_TIMEOUT_SECONDS - 1)
        if server.state != "ready":
            raise RuntimeError(server.error or f"not ready ({server.state})")
        names = [qualified_name(server.name, tool.name) for tool in server.tools]
    finally:
        await server.stop()
    return f"{settings.transport}: {len(names)} tool(s): {', '.join(names) or 'none exposed'}"


def table(results: list[CheckResult]) -> str:
    """The results as a readable table."""
    width = max(len(result.name) for result in results)
    lines = [f"{'CHECK'.ljust(width)}  STATUS  DETAIL"]
    for result in results:
        lines.append(f"{result.name.ljust(width)}  {result.status.upper():<6}  {result.detail}")
    return "\n".join(lines)
