"""Reloading the config on SIGHUP: every key either takes effect or is reported as needing a
restart.

The new file is read and validated first; an invalid one is rejected with its problems logged
and the running config stays. A valid one becomes the *effective* config: the new file with the
keys that only a restart applies (`gateway.runtime_settings.RESTART_ONLY`, each channel's
`restart_only` and `enabled`) kept at their running values, so the running config always says
what the process actually does, and a restart-only change is reported again at every reload
until the process restarts. From the effective config one function builds the settings bundle
(`runtime_settings`); each service whose part of the bundle changed gets its new part:

- users, organizations and identities are synced to the database (identities taken out of the
  file are unlinked; cached lookups dropped);
- the engine: prompt, answer length, history budget, compaction, topics, summaries, recall;
- the turn: routing (scope, archive_after), the budget `/status` shows, the public URL;
- the jobs: archiving and retention;
- the tools: servers whose settings changed are started again, removed ones stopped, new ones
  started, and every server lists its tools again (also when nothing changed);
- each enabled channel: its adapter's `reconfigure` with the channel's reloadable keys.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from channels.registry import channel_plugins
from errors import ConfigError, GatewayError
from gateway.config import load_config
from gateway.identity import configured_identities, sync_identities
from gateway.log import get_logger
from gateway.open_services import reference_finder
from gateway.runtime import GatewayRuntime
from gateway.runtime_settings import RESTART_ONLY, RuntimeSettings, runtime_settings
from gateway.settings import GatewayConfig
from storage.repositories.users import UserRepository

log = get_logger(__name__)


def restart_only_keys() -> tuple[str, ...]:
    """Every config key (dotted; a section stands for all its keys) only a restart applies."""
    keys = list(RESTART_ONLY)
    for plugin in channel_plugins():
        keys.append(f"channels.{plugin.name}.enabled")
        keys.extend(f"channels.{plugin.name}.{name}" for name in sorted(plugin.restart_only))
    return tuple(keys)


async def reload_config(runtime: GatewayRuntime, path: Path | None) -> bool:
    """Read `path` again and apply it; False (and the old config kept) when it is invalid."""
    try:
        new = await asyncio.to_thread(load_config, path)
    except ConfigError as exc:
        log.error("config.reload_rejected", path=str(path), problems=exc.problems)
        return False
    try:
        await apply_config(runtime, new)
    except GatewayError as exc:
        log.error("config.reload_failed", path=str(path), error=str(exc))
        return False
    return True


async def apply_config(runtime: GatewayRuntime, new: GatewayConfig) -> None:
    """Apply what can change while running; log what needs a restart."""
    old = runtime.config
    keys = restart_only_keys()
    needs_restart = [key for key in keys if _get(old, key) != _get(new, key)]
    effective = keep_running_values(old, new, keys)
    await sync_identities(runtime.database, effective)
    removed = set(configured_identities(old)) - set(configured_identities(effective))
    async with runtime.database.session() as db:
        users = UserRepository(db)
        for user_id, channel_type, external_id in sorted(removed):
            await users.unlink_identity(user_id, channel_type, external_id)
    resolver = runtime.dispatcher.identities
    resolver.config = effective
    resolver.forget_cached()
    runtime.engine.organizations.clear()  # `sync_identities` wrote the organizations again
    new_settings = runtime_settings(effective)
    if runtime.toolbox is not None:
        # Every reload lists the servers' tools again (a server may have changed its own).
        await runtime.toolbox.reconfigure(new_settings.tools)
    applied = swap_settings(runtime, new_settings)
    runtime.config = effective
    log.info(
        "config.reloaded",
        users=len(effective.identity.users),
        organizations=len(effective.organizations),
        identities_removed=len(removed),
        applied=applied,
        needs_restart=needs_restart,
    )


def swap_settings(runtime: GatewayRuntime, new: RuntimeSettings) -> list[str]:
    """Hand each service the part of `new` that differs from what it runs with; the names of
    the parts that changed."""
    old = runtime.settings
    applied: list[str] = []
    if (new.engine, new.recall) != (old.engine, old.recall):
        runtime.engine.reconfigure(new.engine, new.recall)
        applied.append("engine")
    if new.resume_by_reference != old.resume_by_reference:
        runtime.service.find_referenced = (
            reference_finder(runtime.database) if new.resume_by_reference else None
        )
        applied.append("resume_by_reference")
    if new.turn != old.turn:
        runtime.dispatcher.processor.reconfigure(new.turn)
        applied.append("turn")
    if new.tools != old.tools:
        applied.append("tools")
    if new.jobs != old.jobs:
        runtime.jobs.reconfigure(new.jobs.archive_after, new.jobs.delete_after)
        applied.append("jobs")
    for channel_type, adapter in runtime.adapters.items():
        settings = new.channels[channel_type]
        if settings != old.channels[channel_type]:
            adapter.reconfigure(settings)
            applied.append(f"channels.{channel_type.value}")
    runtime.settings = new
    return applied


def keep_running_values(
    running: GatewayConfig, new: GatewayConfig, keys: tuple[str, ...]
) -> GatewayConfig:
    """`new` with the value of every key in `keys` taken from `running`."""
    effective: BaseModel = new
    for key in keys:
        effective = _replace(effective, key.split("."), _get(running, key))
    if not isinstance(effective, GatewayConfig):
        raise TypeError("a config replaced by parts is still a GatewayConfig")
    return effective


def _get(config: BaseModel, key: str) -> Any:
    value: Any = config
    for name in key.split("."):
        value = getattr(value, name)
    return value


def _replace(model: BaseModel, path: list[str], value: object) -> BaseModel:
    name, *rest = path
    if rest:
        value = _replace(getattr(model, name), rest, value)
    if getattr(model, name) is value:
        return model
    return model.model_copy(update={name: value})
