"""The running gateway's settings as one frozen value, built from a config by one function.

`runtime_settings(config)` is what start-up wires and what a reload rebuilds: the reload
compares the new bundle with the running one part by part and hands each service the part that
changed (`gateway.reload`). Which config keys a running gateway can change, and which need a
restart, is declared here (`RESTART_ONLY`) and in each channel's plugin; a test holds every key
of the schema to one of the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from channels.base import ChannelType
from channels.files import MB, FileLimits
from channels.registry import channel_plugins
from gateway.settings import GatewayConfig, ToolsConfig
from gateway.turn_values import TurnSettings
from sessions.compaction import CompactionPolicy
from sessions.engine_values import EngineSettings, RecallSettings
from sessions.mcp_servers import McpServerSettings
from sessions.recall_values import RecallOptions
from sessions.routing import RoutingPolicy
from sessions.tool_policy import PolicyRule, ToolPolicy
from sessions.toolbox import ToolSettings

# Config keys (a section, or one key in it) that only a restart applies: what opens sockets,
# pools, stores and clients, or decides how many of them there are. Every other key of the
# schema outside `channels` is applied by a reload; `channels.<type>` keys are declared by
# the channel's plugin (`reloadable` / `restart_only`; `enabled` always needs a restart).
RESTART_ONLY: tuple[str, ...] = (
    "server.host",
    "server.port",
    "server.turn_workers",
    "logging",
    "storage",
    "llm.provider",
    "llm.model",
    "llm.api_key",
    "llm.base_url",
    "llm.timeout",
    "llm.max_retries",
    "llm.region",
    "llm.project_id",
    "llm.offline_latency",
    "llm.offline_token_interval",
    "sessions.max_concurrent_turns",
    "admin",
)

# What a reload applies outside the channels (for the schema test and the docs).
RELOADABLE: tuple[str, ...] = (
    "server.public_url",
    "llm.system_prompt",
    "llm.max_tokens",
    "sessions.scope",
    "sessions.archive_after",
    "sessions.suggest_new_after",
    "sessions.history_budget_tokens",
    "sessions.topic_every_messages",
    "sessions.summary_min_user_messages",
    "sessions.compaction",
    "recall",
    "live",
    "files",
    "organizations",
    "identity",
    "retention",
    # Servers whose settings changed are started again, the others list their tools again.
    "tools",
)


@dataclass(frozen=True, slots=True)
class JobSettings:
    """The background jobs' config: when idle sessions are archived and archived ones deleted."""

    archive_after: timedelta
    delete_after: timedelta | None


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """Everything the running services read from the config, by the service that reads it."""

    engine: EngineSettings
    recall: RecallSettings | None  # None: recall is off
    resume_by_reference: bool
    turn: TurnSettings
    jobs: JobSettings
    tools: ToolSettings
    # Each enabled channel's adapter settings (the type its plugin's `settings_of` returns).
    channels: Mapping[ChannelType, Any]


def runtime_settings(config: GatewayConfig) -> RuntimeSettings:
    """The whole bundle for `config` (pure: no I/O, nothing opened)."""
    sessions = config.sessions
    compaction = CompactionPolicy(
        budget_tokens=sessions.history_budget_tokens,
        trigger_ratio=sessions.compaction.trigger_ratio,
        max_messages=sessions.compaction.max_messages,
        keep_last_messages=sessions.compaction.keep_last_messages,
        summary_max_tokens=sessions.compaction.summary_max_tokens,
    )
    recall = config.recall
    retention_days = config.retention.delete_after_days
    return RuntimeSettings(
        engine=EngineSettings(
            system_prompt=config.llm.system_prompt,
            max_tokens=config.llm.max_tokens,
            compaction=compaction,
            topic_every_messages=sessions.topic_every_messages,
            suggest_new_after=sessions.suggest_new_after,
            summary_min_user_messages=sessions.summary_min_user_messages,
        ),
        recall=RecallSettings(
            auto_hits=recall.auto_hits,
            auto_context_tokens=recall.auto_context_tokens,
            tool=recall.tool,
            options=RecallOptions(dense=recall.dense),
        )
        if recall.enabled
        else None,
        resume_by_reference=recall.resume_by_reference,
        turn=TurnSettings(
            routing=RoutingPolicy(sessions.scope, sessions.archive_after),
            history_budget_tokens=sessions.history_budget_tokens,
            pull_channels=frozenset(
                plugin.name for plugin in channel_plugins() if plugin.pulls_replies
            ),
            public_url=config.server.public_url or "",
            status_texts=config.live.status.model_dump(),
            files=FileLimits(
                enabled=config.files.enabled,
                max_file_bytes=config.files.max_file_mb * MB,
                max_message_bytes=config.files.max_message_mb * MB,
                max_files=config.files.max_files_per_message,
            ),
        ),
        jobs=JobSettings(
            archive_after=sessions.archive_after,
            delete_after=timedelta(days=retention_days) if retention_days else None,
        ),
        tools=tool_settings(config.tools),
        channels={
            plugin.channel_type: plugin.settings_of(section)
            for plugin in channel_plugins()
            if plugin.enabled(section := config.channels.section(plugin.name))
        },
    )


def tool_settings(tools: ToolsConfig) -> ToolSettings:
    """The ``tools:`` section as the session layer's values (secrets revealed here only)."""
    return ToolSettings(
        max_rounds=tools.max_rounds,
        confirm_within=tools.confirm_within,
        servers=tuple(
            McpServerSettings(
                name=server.name,
                transport=server.transport,
                command=server.command or "",
                args=server.args,
                env=tuple((name, value.get_secret_value()) for name, value in server.env.items()),
                url=server.url or "",
                headers=tuple(
                    (name, value.get_secret_value()) for name, value in server.headers.items()
                ),
                timeout=server.timeout,
                max_result_chars=server.max_result_chars,
                expose=server.expose,
                confirm=server.confirm,
            )
            for server in tools.mcp_servers
            if server.enabled
        ),
        policy=ToolPolicy(
            tuple(
                PolicyRule(orgs=rule.orgs, users=rule.users, allow=rule.allow, deny=rule.deny)
                for rule in tools.policy
            )
        ),
    )
