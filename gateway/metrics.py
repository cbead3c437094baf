"""Prometheus metrics of the gateway, kept in one registry per running app.

A registry per app (instead of the process-global default) lets tests start several apps in one
process and read each one's figures on its own.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.process_collector import ProcessCollector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class GatewayMetrics:
    """The metric objects of one app; channels and jobs record into these."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.info = Info(
            "gateway", "Gateway build and configuration facts.", registry=self.registry
        )
        self.http_requests = Counter(
            "gateway_http_requests",
            "HTTP requests answered, by route and status code.",
            ["route", "status"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "gateway_http_request_duration_seconds",
            "Time to answer an HTTP request, by route.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

        self.messages_in = Counter(
            "gateway_messages_in",
            "Inbound messages accepted, by channel.",
            ["channel"],
            registry=self.registry,
        )
        self.duplicates_dropped = Counter(
            "gateway_duplicates_dropped",
            "Inbound messages dropped as platform retries of one already accepted, by channel.",
            ["channel"],
            registry=self.registry,
        )
        self.messages_rejected = Counter(
            "gateway_messages_rejected",
            "Inbound messages refused (unknown sender, bad request …), by channel and reason.",
            ["channel", "reason"],
            registry=self.registry,
        )
        self.messages_out = Counter(
            "gateway_messages_out",
            "Replies handed to a platform, by channel and outcome (delivered, retry, failed).",
            ["channel", "outcome"],
            registry=self.registry,
        )
        self.turn_latency = Histogram(
            "gateway_turn_duration_seconds",
            "Time from taking a message off the inbox to committing its reply.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.llm_latency = Histogram(
            "gateway_llm_request_duration_seconds",
            "Time of one language-model call, by provider.",
            ["provider"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.llm_tokens = Counter(
            "gateway_llm_tokens",
            "Tokens billed by the language model, by provider and kind (input, output).",
            ["provider", "kind"],
            registry=self.registry,
        )
        self.live_updates = Counter(
            "gateway_live_updates",
            "Platform calls of live replies, by channel, kind (status, text) and outcome "
            "(ok, rate_limited, failed, stopped).",
            ["channel", "kind", "outcome"],
            registry=self.registry,
        )
        self.compactions = Counter(
            "gateway_compactions",
            "Sessions compacted (full transcript archived first, then summarised).",
            registry=self.registry,
        )
        self.archive_failures = Counter(
            "gateway_archive_failures",
            "Compactions deferred because the transcript archive could not be written.",
            registry=self.registry,
        )
        self.outbox_backlog = Gauge(
            "gateway_outbox_backlog",
            "Replies waiting to be sent (pending or being sent), at the last scrape.",
            registry=self.registry,
        )
        self.active_sessions = Gauge(
            "gateway_active_sessions",
            "Sessions in the active state, at the last scrape.",
            registry=self.registry,
        )
        self.inbox_backlog = Gauge(
            "gateway_inbox_backlog",
            "Inbound messages stored but not yet answered, at the last scrape.",
            registry=self.registry,
        )
        self.tool_calls = Counter(
            "gateway_tool_calls",
            "Calls of MCP servers' tools, by tool (server__tool).",
            ["tool"],
            registry=self.registry,
        )
        self.tool_errors = Counter(
            "gateway_tool_errors",
            "Tool calls that failed, timed out or returned an error, by tool.",
            ["tool"],
            registry=self.registry,
        )
        self.tool_latency = Histogram(
            "gateway_tool_latency_seconds",
            "Seconds a tool call took, by tool.",
            ["tool"],
            registry=self.registry,
        )
        self.sessions_transitioned = Counter(
            "gateway_session_transitions",
            "Session lifecycle transitions, by target state.",
            ["status"],
            registry=self.registry,
        )

    def tool_called(self, tool: str, seconds: float, failed: bool) -> None:
        """One tool call (``server__tool``): counted, timed, and counted again if it failed."""
        self.tool_calls.labels(tool).inc()
        self.tool_latency.labels(tool).observe(seconds)
        if failed:
            self.tool_errors.labels(tool).inc()

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)
