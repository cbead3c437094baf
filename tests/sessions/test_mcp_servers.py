"""MCP servers as the toolbox keeps them: a stdio process and a streamable HTTP endpoint, both
real servers written with the SDK; tools listed under `server__tool`, exposed and confirmed
by glob, calls within their timeout, results capped, a broken server taking only its own
tools away, and the policy applied before any call leaves the gateway."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from errors import ToolError
from sessions.tool_policy import PolicyRule, ToolPolicy
from sessions.toolbox import McpToolbox, ToolSettings
from tests.fakes.mcp_http import HttpToolServer
from tests.sessions.tool_servers import http_server, logged_calls, stdio_server

EVERYONE = ToolPolicy((PolicyRule(orgs=("*",), allow=("*",)),))


@pytest.fixture
def crm() -> Iterator[HttpToolServer]:
    with HttpToolServer("crm") as server:
        yield server


@pytest.fixture
async def toolbox(tmp_path: Path, crm: HttpToolServer) -> AsyncIterator[McpToolbox]:
    box = McpToolbox(
        ToolSettings(
            servers=(
                stdio_server(
                    "orders",
                    tmp_path / "orders.log",
                    env={"ORDERS_DB": "orders.sqlite"},
                    timeout=timedelta(seconds=1),
                    expose=("lookup_order", "slow", "env_names", "big", "exit_now"),
                    max_result_chars=500,
                ),
                http_server(
                    "crm",
                    crm.url,
                    headers=(("Authorization", "Bearer crm-token"),),
                    confirm=("delete_*",),
                ),
            ),
            policy=EVERYONE,
        )
    )
    await box.start()
    yield box
    await box.close()


async def test_both_servers_list_their_exposed_tools_as_server__tool(
    toolbox: McpToolbox,
) -> None:
    names = {tool.name for tool in toolbox.offered("acme", "alice")}
    assert {"orders__lookup_order", "orders__slow", "orders__env_names", "orders__big"} <= names
    assert "orders__delete_contact" not in names  # not in the stdio server's `expose`
    assert {"crm__lookup_order", "crm__delete_contact", "crm__inject"} <= names
    confirming = {tool.name for tool in toolbox.offered("acme", "alice") if tool.tool.confirm}
    assert confirming == {"crm__delete_contact"}
    assert [status.state for status in toolbox.statuses()] == ["ready", "ready"]


async def test_a_call_reaches_the_right_server_with_only_its_arguments(
    toolbox: McpToolbox, tmp_path: Path, crm: HttpToolServer
) -> None:
    stdio = await toolbox.call(
        "orders__lookup_order", {"order_id": "A-1"}, org_id="acme", user_id="alice"
    )
    http = await toolbox.call(
        "crm__lookup_order", {"order_id": "B-2"}, org_id="acme", user_id="alice"
    )
    assert stdio.text == "order A-1 from orders: shipped"
    assert http.text == "order B-2 from crm: shipped"
    assert logged_calls(tmp_path / "orders.log") == [("lookup_order", {"order_id": "A-1"})]
    assert crm.calls == [("lookup_order", {"order_id": "B-2"})]
    # The declared header reached the HTTP server; nothing names the user.
    assert any(h.get("authorization") == "Bearer crm-token" for h in crm.headers_seen)
    assert not any("alice" in json.dumps(h) for h in crm.headers_seen)


async def test_a_stdio_server_runs_with_only_the_environment_it_declares(
    toolbox: McpToolbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    result = await toolbox.call("orders__env_names", {}, org_id="acme", user_id="alice")
    env = json.loads(result.text)
    # Python itself sets LC_CTYPE in a process started without a locale (PEP 538).
    env.pop("LC_CTYPE", None)
    assert env == {"ORDERS_DB": "orders.sqlite"}


async def test_a_hung_call_costs_only_its_timeout(toolbox: McpToolbox) -> None:
    started = time.perf_counter()
    with pytest.raises(ToolError, match="timed out after 1s"):
        await toolbox.call("orders__slow", {"seconds": 30}, org_id="acme", user_id="alice")
    assert time.perf_counter() - started < 2.5
    # The server still answers the next call.
    result = await toolbox.call(
        "orders__lookup_order", {"order_id": "A-3"}, org_id="acme", user_id="alice"
    )
    assert result.text.startswith("order A-3")


async def test_a_long_result_is_cut_at_the_servers_cap(toolbox: McpToolbox) -> None:
    result = await toolbox.call("orders__big", {"chars": 5000}, org_id="acme", user_id="alice")
    assert result.truncated
    assert result.text.startswith("x" * 500 + "\n[result cut: 4500 more characters")


async def test_a_broken_server_disables_only_its_own_tools_and_comes_back(
    toolbox: McpToolbox, tmp_path: Path
) -> None:
    with pytest.raises(ToolError):
        await toolbox.call("orders__exit_now", {}, org_id="acme", user_id="alice")
    names = {tool.name for tool in toolbox.offered("acme", "alice")}
    assert not any(name.startswith("orders__") for name in names)
    assert "crm__lookup_order" in names
    result = await toolbox.call(
        "crm__lookup_order", {"order_id": "C-1"}, org_id="acme", user_id="alice"
    )
    assert result.text.startswith("order C-1")
    # The process is started again and lists its tools.
    for _ in range(100):
        if any(t.name == "orders__lookup_order" for t in toolbox.offered("acme", "alice")):
            break
        await asyncio.sleep(0.05)
    again = await toolbox.call(
        "orders__lookup_order", {"order_id": "A-9"}, org_id="acme", user_id="alice"
    )
    assert again.text.startswith("order A-9")


async def test_a_server_that_cannot_start_is_reported_and_the_others_work(
    tmp_path: Path, crm: HttpToolServer
) -> None:
    box = McpToolbox(
        ToolSettings(
            servers=(
                stdio_server("orders", tmp_path / "o.log").__class__(
                    name="broken", transport="stdio", command="/nonexistent/server"
                ),
                http_server("crm", crm.url),
            ),
            policy=EVERYONE,
        ),
        start_wait=5.0,
    )
    await box.start()
    try:
        states = {status.name: status for status in box.statuses()}
        assert states["broken"].state == "failed"
        assert states["broken"].tools == ()
        assert states["crm"].state == "ready"
        with pytest.raises(ToolError):
            await box.call("broken__anything", {}, org_id="acme", user_id="alice")
    finally:
        await box.close()


async def test_a_tool_outside_the_users_policy_never_reaches_the_server(
    tmp_path: Path, crm: HttpToolServer
) -> None:
    log = tmp_path / "orders.log"
    box = McpToolbox(
        ToolSettings(
            servers=(stdio_server("orders", log), http_server("crm", crm.url)),
            policy=ToolPolicy(
                (
                    PolicyRule(orgs=("acme",), allow=("orders__lookup_order", "crm__*")),
                    PolicyRule(users=("bob",), deny=("orders__*",)),
                )
            ),
        )
    )
    await box.start()
    try:
        assert {t.name for t in box.offered("acme", "bob")} == {
            f"crm__{name}"
            for name in (
                "lookup_order",
                "slow",
                "env_names",
                "big",
                "delete_contact",
                "inject",
                "exit_now",
            )
        }
        assert "orders__lookup_order" in {t.name for t in box.offered("acme", "alice")}
        assert box.offered("globex", "carol") == ()
        with pytest.raises(ToolError, match="no tool named"):
            await box.call("orders__lookup_order", {"order_id": "1"}, org_id="acme", user_id="bob")
        with pytest.raises(ToolError, match="no tool named"):
            await box.call("orders__slow", {"seconds": 0}, org_id="acme", user_id="alice")
        assert logged_calls(log) == []
    finally:
        await box.close()
