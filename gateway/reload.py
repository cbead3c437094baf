"""Reloading the config on SIGHUP: identity and policy changes apply without a restart.

The new file is read and validated first; an invalid one is rejected with its problems logged
and the running config stays. A valid one is applied to what can change in a running gateway:
users, organizations and identities (synced to the database; identities taken out of the
file are unlinked; caches dropped), routing and session policy,
the system prompt and answer length, retention, web tokens, the Slack workspace and Teams
tenant allow-lists and text limits. Changes that need a restart (server address, storage,
model provider and credentials, channels switched on or off, channel secrets) are logged as
such and otherwise left as they were.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from pathlib import Path

from errors import ConfigError, GatewayError
from gateway.config import load_config
from gateway.identity import configured_identities, sync_identities
from gateway.log import get_logger
from gateway.runtime import GatewayRuntime
from gateway.settings import GatewayConfig
from sessions.routing import RoutingPolicy
from storage.repositories.users import UserRepository

log = get_logger(__name__)

# Sections (or keys) whose changes only a restart applies.
RESTART_KEYS = (
    ("server",),
    ("storage",),
    ("llm", "provider"),
    ("llm", "model"),
    ("llm", "api_key"),
    ("llm", "base_url"),
    ("channels", "slack", "enabled"),
    ("channels", "slack", "mode"),
    ("channels", "slack", "bot_token"),
    ("channels", "slack", "signing_secret"),
    ("channels", "teams", "enabled"),
    ("channels", "teams", "app_id"),
    ("channels", "teams", "app_password"),
    ("channels", "email", "enabled"),
    ("channels", "web", "enabled"),
    ("admin",),
)


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
    needs_restart = [".".join(key) for key in RESTART_KEYS if _get(old, key) != _get(new, key)]
    await sync_identities(runtime.database, new)
    removed = set(configured_identities(old)) - set(configured_identities(new))
    async with runtime.database.session() as db:
        users = UserRepository(db)
        for user_id, channel_type, external_id in sorted(removed):
            await users.unlink_identity(user_id, channel_type, external_id)
    resolver = runtime.dispatcher.identities
    resolver.config = new
    resolver.forget_cached()
    processor = runtime.dispatcher.processor
    processor.settings = dataclasses.replace(
        processor.settings,
        routing=RoutingPolicy(new.sessions.scope, new.sessions.archive_after),
        history_budget_tokens=new.sessions.history_budget_tokens,
        public_url=new.server.public_url or "",
    )
    processor.service.routing = processor.settings.routing
    engine = runtime.engine
    engine.organizations.clear()  # `sync_identities` wrote the organizations again
    engine.settings = dataclasses.replace(
        engine.settings,
        system_prompt=new.llm.system_prompt,
        max_tokens=new.llm.max_tokens,
        suggest_new_after=new.sessions.suggest_new_after,
    )
    jobs = runtime.jobs
    jobs.archive_after = new.sessions.archive_after
    days = new.retention.delete_after_days
    jobs.delete_after = timedelta(days=days) if days else None
    if runtime.web is not None:
        web = new.channels.web
        runtime.web.settings = dataclasses.replace(
            runtime.web.settings,
            dev_open=web.dev_open,
            tokens={t.token.get_secret_value(): t.user for t in web.tokens},
            max_text_chars=web.max_text_chars,
        )
    if runtime.slack is not None:
        slack = new.channels.slack
        runtime.slack.settings = dataclasses.replace(
            runtime.slack.settings,
            allowed_team_ids=frozenset(slack.allowed_team_ids),
            max_text_chars=slack.max_text_chars,
        )
    if runtime.teams is not None:
        runtime.teams.settings = dataclasses.replace(
            runtime.teams.settings, tenant_ids=tuple(new.channels.teams.tenant_ids)
        )
    runtime.config = new
    log.info(
        "config.reloaded",
        users=len(new.identity.users),
        organizations=len(new.organizations),
        identities_removed=len(removed),
        needs_restart=needs_restart,
    )


def _get(config: GatewayConfig, key: tuple[str, ...]) -> object:
    value: object = config
    for name in key:
        value = getattr(value, name)
    return value
