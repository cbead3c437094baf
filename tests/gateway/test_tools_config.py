"""The `tools:` section as `gateway config check` sees it: each mistake reported at its own
line and key, secrets kept secret, and the section turned into the session layer's settings
(only enabled servers; `confirm: true` meaning every tool)."""

from __future__ import annotations

from datetime import timedelta

from gateway.config import check_config, load_config
from gateway.runtime_settings import tool_settings
from tests.gateway.config_problems import problem_lines


def test_a_valid_section_becomes_the_session_layers_settings(write_config):
    path = write_config(
        """
        tools:
          max_rounds: 3
          confirm_within: 2m
          mcp_servers:
            - name: orders
              transport: stdio
              command: /usr/bin/python3
              args: [orders.py]
              env: {ORDERS_DB: "${ORDERS_DB}"}
              timeout: 5s
              confirm: true
            - name: crm
              transport: http
              url: https://crm.internal/mcp
              headers: {Authorization: "Bearer ${CRM_TOKEN}"}
              expose: [lookup_*]
              max_result_chars: 1000
            - name: legacy
              enabled: false
              transport: http
              url: https://legacy.internal/mcp
          policy:
            - {orgs: [acme], allow: ["orders__lookup_order", "crm__*"]}
            - {users: [bob], deny: ["orders__*"]}
        """
    )
    config = load_config(path, {"ORDERS_DB": "/srv/orders.db", "CRM_TOKEN": "t0k3n"})
    assert "t0k3n" not in repr(config.tools)
    settings = tool_settings(config.tools)
    assert settings.max_rounds == 3
    assert settings.confirm_within == timedelta(minutes=2)
    orders, crm = settings.servers
    assert (orders.name, orders.env, orders.confirm) == (
        "orders",
        (("ORDERS_DB", "/srv/orders.db"),),
        ("*",),
    )
    assert orders.timeout == timedelta(seconds=5)
    assert crm.headers == (("Authorization", "Bearer t0k3n"),)
    assert "t0k3n" not in repr(crm)
    assert (crm.expose, crm.max_result_chars, crm.confirm) == (("lookup_*",), 1000, ())
    assert settings.policy.allows("acme", "alice", "orders__lookup_order")
    assert not settings.policy.allows("acme", "bob", "orders__lookup_order")


def test_each_mistake_is_reported_at_its_line_and_key(write_config):
    path = write_config(
        """
        tools:
          max_rounds: 0
          mcp_servers:
            - name: orders
              transport: stdio
              url: https://orders.internal/mcp
            - name: bad__name
              transport: http
              command: /bin/true
            - name: orders
              transport: carrier-pigeon
          policy:
            - allow: ["*"]
            - orgs: [acme]
              alow: ["crm__*"]
        """
    )
    assert problem_lines(path) == [
        f"{path}:2: tools.max_rounds: Input should be greater than or equal to 1",
        f"{path}:4: tools.mcp_servers[0].command: required for transport stdio",
        f"{path}:6: tools.mcp_servers[0].url: only for transport http",
        # The transport's rules wait until the name is valid.
        f"{path}:7: tools.mcp_servers[1].name: invalid server name 'bad__name': use 1-32 "
        "letters, digits, '-' or single '_' (its tools are named <server>__<tool>)",
        f"{path}:11: tools.mcp_servers[2].transport: Input should be 'stdio' or 'http'",
        f'{path}:13: tools.policy[0].orgs: a rule names orgs or users (a glob: ["*"] is all)',
        f"{path}:15: tools.policy[1].alow: unknown key (did you mean 'allow'?)",
    ]


def test_two_servers_may_not_share_a_name(write_config):
    path = write_config(
        """
        tools:
          mcp_servers:
            - {name: crm, transport: http, url: "http://127.0.0.1:1/mcp"}
            - {name: crm, transport: http, url: "http://127.0.0.1:2/mcp"}
        """
    )
    assert problem_lines(path) == [
        f"{path}:4: tools.mcp_servers[1].name: duplicate server name 'crm' (also mcp_servers[0])"
    ]


def test_a_missing_secret_is_named(write_config):
    path = write_config(
        """
        tools:
          mcp_servers:
            - name: crm
              transport: http
              url: https://crm.internal/mcp
              headers: {Authorization: "Bearer ${CRM_TOKEN}"}
        """
    )
    assert [(p.line, p.key_path) for p in check_config(path, {})] == [
        (6, "tools.mcp_servers[0].headers.Authorization")
    ]
