"""The reload plan, without processes: every config key is either applied by a reload or
reported as needing a restart (never both, never neither); each channel plugin declares all
its keys; the effective config keeps restart-only keys at their running values; and the
settings bundle changes exactly in the parts a reloaded key feeds."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from channels.base import ChannelType
from channels.registry import channel_plugins
from gateway.reload import keep_running_values, restart_only_keys
from gateway.runtime_settings import RELOADABLE, RuntimeSettings, runtime_settings
from gateway.settings import GatewayConfig


def reloadable_keys() -> tuple[str, ...]:
    """`RELOADABLE` and every channel's reloadable keys, dotted like `restart_only_keys`."""
    keys = list(RELOADABLE)
    for plugin in channel_plugins():
        keys.extend(f"channels.{plugin.name}.{name}" for name in sorted(plugin.reloadable))
    return tuple(keys)


def covered_by(key: str, entries: tuple[str, ...]) -> list[str]:
    """The entries that name `key` itself or a section it is in."""
    return [entry for entry in entries if key == entry or key.startswith(f"{entry}.")]


def value_at(config: BaseModel, key: str) -> Any:
    value: Any = config
    for name in key.split("."):
        value = getattr(value, name)
    return value


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` laid over it, section by section."""
    result = dict(base)
    for name, value in changes.items():
        if isinstance(value, dict) and isinstance(result.get(name), dict):
            result[name] = merged(result[name], value)
        else:
            result[name] = value
    return result


def differing(old: object, new: object) -> set[str]:
    """The names of the fields of two dataclass values that differ."""
    return {
        field.name
        for field in dataclasses.fields(old)  # type: ignore[arg-type]
        if getattr(old, field.name) != getattr(new, field.name)
    }


def schema_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """The dotted path of every leaf key of a config model (lists of models are leaves)."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from schema_keys(annotation, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


BASE: dict[str, Any] = {
    "organizations": [{"id": "acme", "name": "Acme"}],
    "identity": {"users": [{"id": "alice", "org": "acme"}]},
    "channels": {
        "web": {"dev_open": False, "tokens": [{"token": "web-token-1", "user": "alice"}]},
        "slack": {"enabled": True, "bot_token": "xoxb-old", "signing_secret": "secret-old"},
    },
}


def test_every_config_key_is_either_reloadable_or_restart_only() -> None:
    reloadable, restart_only = reloadable_keys(), restart_only_keys()
    neither: list[str] = []
    both: list[str] = []
    for key in schema_keys(GatewayConfig):
        applied, restart = covered_by(key, reloadable), covered_by(key, restart_only)
        if not applied and not restart:
            neither.append(key)
        elif applied and restart:
            both.append(f"{key} (reloadable: {applied}; restart-only: {restart})")
    assert (neither, both) == ([], []), f"neither: {neither}\nboth: {both}"


def test_every_declared_key_is_a_key_of_the_schema() -> None:
    keys = list(schema_keys(GatewayConfig))
    unknown = [
        entry
        for entry in (*reloadable_keys(), *restart_only_keys())
        if not any(key == entry or key.startswith(f"{entry}.") for key in keys)
    ]
    assert unknown == []


@pytest.mark.parametrize("plugin", channel_plugins(), ids=lambda plugin: plugin.name)
def test_a_channel_plugin_declares_each_field_of_its_section_once(plugin: Any) -> None:
    enabled = frozenset({"enabled"})
    assert plugin.reloadable.isdisjoint(plugin.restart_only)
    assert plugin.reloadable.isdisjoint(enabled)
    assert plugin.restart_only.isdisjoint(enabled)
    declared = plugin.reloadable | plugin.restart_only | enabled
    assert declared == set(plugin.config_model.model_fields)


def test_the_effective_config_keeps_restart_only_keys_and_takes_the_rest_from_the_file() -> None:
    running = GatewayConfig.model_validate(BASE)
    new = GatewayConfig.model_validate(
        merged(
            BASE,
            {
                "storage": {"pool_size": 3},  # restart only
                "llm": {"model": "claude-other", "system_prompt": "Be brief."},  # one of each
                "channels": {
                    "slack": {"bot_token": "xoxb-new", "max_text_chars": 500},  # one of each
                    "web": {"tokens": [{"token": "web-token-2", "user": "alice"}]},
                },
                "sessions": {"history_budget_tokens": 12_345},
                "retention": {"delete_after_days": 30},
            },
        )
    )
    restart_only = restart_only_keys()

    effective = keep_running_values(running, new, restart_only)

    assert isinstance(effective, GatewayConfig)
    changed = [k for k in schema_keys(GatewayConfig) if value_at(running, k) != value_at(new, k)]
    assert sorted(changed) == [
        "channels.slack.bot_token",
        "channels.slack.max_text_chars",
        "channels.web.tokens",
        "llm.model",
        "llm.system_prompt",
        "retention.delete_after_days",
        "sessions.history_budget_tokens",
        "storage.pool_size",
    ]
    kept_from_running = [
        key
        for key in schema_keys(GatewayConfig)
        if covered_by(key, restart_only) and value_at(effective, key) != value_at(running, key)
    ]
    not_taken_from_new = [
        key
        for key in schema_keys(GatewayConfig)
        if not covered_by(key, restart_only) and value_at(effective, key) != value_at(new, key)
    ]
    assert kept_from_running == []
    assert not_taken_from_new == []
    assert effective.storage.pool_size == 10
    assert effective.llm.model == running.llm.model
    assert effective.channels.slack.bot_token.get_secret_value() == "xoxb-old"  # type: ignore[attr-defined]
    assert effective.channels.slack.max_text_chars == 500  # type: ignore[attr-defined]
    assert effective.llm.system_prompt == "Be brief."
    assert effective.sessions.history_budget_tokens == 12_345


def test_the_effective_config_of_an_unchanged_file_is_the_running_one() -> None:
    running = GatewayConfig.model_validate(BASE)
    new = GatewayConfig.model_validate(BASE)
    assert keep_running_values(running, new, restart_only_keys()) == running


def check_budget(old: RuntimeSettings, new: RuntimeSettings) -> None:
    assert differing(old.engine, new.engine) == {"compaction"}
    assert differing(old.engine.compaction, new.engine.compaction) == {"budget_tokens"}
    assert differing(old.turn, new.turn) == {"history_budget_tokens"}
    assert new.engine.compaction.budget_tokens == new.turn.history_budget_tokens == 12_345


def check_recall_off(old: RuntimeSettings, new: RuntimeSettings) -> None:
    assert old.recall is not None
    assert new.recall is None


def check_retention(old: RuntimeSettings, new: RuntimeSettings) -> None:
    assert differing(old.jobs, new.jobs) == {"delete_after"}
    assert (old.jobs.delete_after, new.jobs.delete_after) == (None, timedelta(days=30))


def check_prompt(old: RuntimeSettings, new: RuntimeSettings) -> None:
    assert differing(old.engine, new.engine) == {"system_prompt", "max_tokens"}
    assert (new.engine.system_prompt, new.engine.max_tokens) == ("Be brief.", 256)


def check_compaction(old: RuntimeSettings, new: RuntimeSettings) -> None:
    assert differing(old.engine, new.engine) == {"compaction"}
    assert differing(old.engine.compaction, new.engine.compaction) == {
        "max_messages",
        "keep_last_messages",
    }


def check_recall_tool(old: RuntimeSettings, new: RuntimeSettings) -> None:
    assert old.recall is not None
    assert new.recall is not None
    assert differing(old.recall, new.recall) == {"tool"}


def check_tools(old: RuntimeSettings, new: RuntimeSettings) -> None:
    assert differing(old.tools, new.tools) == {"max_rounds", "policy"}
    assert new.tools.max_rounds == 3
    assert new.tools.policy.allows("acme", "alice", "crm__lookup")


def check_web_tokens(old: RuntimeSettings, new: RuntimeSettings) -> None:
    assert set(old.channels) == set(new.channels) == {ChannelType.WEB, ChannelType.SLACK}
    changed = {kind for kind in old.channels if old.channels[kind] != new.channels[kind]}
    assert changed == {ChannelType.WEB}
    assert differing(old.channels[ChannelType.WEB], new.channels[ChannelType.WEB]) == {"tokens"}


@pytest.mark.parametrize(
    ("changes", "parts", "check"),
    [
        (
            {"sessions": {"history_budget_tokens": 12_345}},
            {"engine", "turn"},
            check_budget,
        ),
        ({"recall": {"enabled": False}}, {"recall"}, check_recall_off),
        ({"retention": {"delete_after_days": 30}}, {"jobs"}, check_retention),
        (
            {"llm": {"system_prompt": "Be brief.", "max_tokens": 256}},
            {"engine"},
            check_prompt,
        ),
        (
            {"sessions": {"compaction": {"max_messages": 4, "keep_last_messages": 1}}},
            {"engine"},
            check_compaction,
        ),
        ({"recall": {"tool": False}}, {"recall"}, check_recall_tool),
        (
            {"channels": {"web": {"tokens": [{"token": "web-token-2", "user": "alice"}]}}},
            {"channels"},
            check_web_tokens,
        ),
        (
            {"tools": {"max_rounds": 3, "policy": [{"orgs": ["acme"], "allow": ["crm__*"]}]}},
            {"tools"},
            check_tools,
        ),
    ],
    ids=[
        "budget",
        "recall_off",
        "retention",
        "prompt",
        "compaction",
        "recall_tool",
        "web_tokens",
        "tools",
    ],
)
def test_a_reloadable_change_changes_only_the_settings_it_feeds(
    changes: dict[str, Any], parts: set[str], check: Any
) -> None:
    old = runtime_settings(GatewayConfig.model_validate(BASE))
    new = runtime_settings(GatewayConfig.model_validate(merged(BASE, changes)))
    assert differing(old, new) == parts
    check(old, new)


def test_the_same_config_builds_equal_settings() -> None:
    config = GatewayConfig.model_validate(BASE)
    assert runtime_settings(config) == runtime_settings(GatewayConfig.model_validate(BASE))
