"""Who sent a message: config users synced to the database, lookups, and provisioning.

Admins declare users in `identity.users`; on start-up they (and their organizations) are
written to the database with one channel identity per Slack id, Teams id, email address and
web id. A sender nobody declared is, with `identity.link_by_email: true`, linked to the
configured user whose email address the platform reports for them (Slack `users.info`); else
rejected (the default) or, with `identity.unknown_users: provision`, created on the fly when
their workspace, tenant or email domain is on the allow-list.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from channels.base import ChannelMessage
from gateway.inbox import normalise_identifier
from gateway.log import get_logger
from gateway.settings import GatewayConfig, IdentityConfig
from primitives.bounded_cache import BoundedCache
from storage.database import Database
from storage.repositories.users import (
    OrganizationRepository,
    UserFields,
    UserRepository,
    identity_conflict,
    sender_owner,
)

log = get_logger(__name__)

DEFAULT_ORG_ID = "default"
CACHED_LOOKUPS = 100_000  # senders, and users' identity keys, kept at most


@dataclass(frozen=True, slots=True)
class ResolvedUser:
    """The user a message belongs to."""

    user_id: str
    org_id: str
    display_name: str
    provisioned: bool = False


def default_org_id(config: GatewayConfig) -> str:
    """The organization of users that name none (the first configured, else `default`)."""
    return config.organizations[0].id if config.organizations else DEFAULT_ORG_ID


def configured_identities(config: GatewayConfig) -> list[tuple[str, str, str]]:
    """(user id, channel type, external id) for every identity the config declares."""
    identities: list[tuple[str, str, str]] = []
    for user in config.identity.users:
        identities.append((user.id, "web", user.id))
        identities.extend((user.id, "slack", value) for value in user.slack)
        identities.extend((user.id, "teams", value) for value in user.teams)
        identities.extend((user.id, "email", value.lower()) for value in user.email)
    return identities


async def sync_identities(database: Database, config: GatewayConfig) -> None:
    """Write the configured organizations, users and identities to the database.

    An identity the database already gives to another user (say, a provisioned one) is left
    as it is and logged: moving it would hand that user's conversations to someone else.
    """
    async with database.session() as session:
        organizations = OrganizationRepository(session)
        if config.organizations:
            for organization in config.organizations:
                await organizations.upsert(
                    organization.id, organization.name or organization.id, organization.context
                )
        else:
            await organizations.upsert(DEFAULT_ORG_ID, "Default")
        users = UserRepository(session)
        await users.upsert_many(
            [
                UserFields(user.id, user.org or default_org_id(config), user.name, user.admin)
                for user in config.identity.users
            ]
        )
        conflicts = await users.link_identities(list(configured_identities(config)))
    for user_id, channel_type, external_id, owner in conflicts:
        error = identity_conflict(channel_type, external_id, owner)
        log.error("identity.conflict", user_id=user_id, channel=channel_type, error=error)
    log.info(
        "identity.synced",
        users=len(config.identity.users),
        organizations=max(1, len(config.organizations)),
    )


def provisioning_allowed(identity: IdentityConfig, message: ChannelMessage) -> bool:
    """Whether an unknown sender may get a user: their tenant must be on the allow-list."""
    if identity.unknown_users != "provision":
        return False
    allowed = identity.provision
    tenant = message.tenant.strip()
    match message.channel_type.value:
        case "slack":
            return tenant in allowed.slack_team_ids
        case "teams":
            return tenant in allowed.teams_tenant_ids
        case "email":
            domain = message.user_identifier.rpartition("@")[2].lower()
            return domain in {value.lower() for value in allowed.email_domains}
        case _:
            return False


def provisioned_user_id(channel_type: str, external_id: str) -> str:
    """A stable, path-safe id for a provisioned user."""
    digest = hashlib.sha256(f"{channel_type}:{external_id}".encode()).hexdigest()[:16]
    return f"{channel_type}-{digest}"


EmailLookup = Callable[[str], Awaitable[str | None]]


class IdentityResolver:
    """Maps a message's sender to a user, provisioning one where the config allows.

    Known senders are cached for `cache_ttl` seconds: the dispatcher looks them up for every
    scheduling pass, and identities change rarely (a change shows after at most the TTL).
    `email_lookups` maps a channel to the function that asks the platform for a sender's email
    address (used only with `identity.link_by_email`).
    """

    def __init__(
        self,
        database: Database,
        config: GatewayConfig,
        *,
        cache_ttl: float = 30.0,
        email_lookups: Mapping[str, EmailLookup] | None = None,
    ) -> None:
        self.database = database
        self.config = config
        self.email_lookups = dict(email_lookups or {})
        self._cache: BoundedCache[str, ResolvedUser] = BoundedCache(CACHED_LOOKUPS, ttl=cache_ttl)
        self._keys_cache: BoundedCache[str, list[str]] = BoundedCache(CACHED_LOOKUPS, ttl=cache_ttl)

    def cached_sender(self, sender_key: str) -> ResolvedUser | None:
        """The sender key's user if it was looked up lately, without asking the database."""
        return self._cache.get(sender_key)

    async def known_sender(self, sender_key: str) -> ResolvedUser | None:
        """The user owning a sender key (`channel:external id`), or None if nobody does."""
        cached = self.cached_sender(sender_key)
        if cached is not None:
            return cached
        channel, _, external_id = sender_key.partition(":")
        async with self.database.statement(writes=False) as db:
            owner = await sender_owner(db, channel, external_id)
        if owner is None:
            self._cache.pop(sender_key)
            return None
        # The dispatcher asks for the user's queues next (`identity_keys`): read already.
        self._keys_cache.put(owner.user_id, list(owner.sender_keys))
        return self._remember(
            sender_key,
            ResolvedUser(owner.user_id, owner.org_id, owner.display_name, owner.provisioned),
        )

    def _remember(self, sender_key: str, resolved: ResolvedUser) -> ResolvedUser:
        self._cache.put(sender_key, resolved)
        return resolved

    async def resolve(self, message: ChannelMessage) -> ResolvedUser | None:
        """The sender's user, or None when the sender is unknown and may not be provisioned."""
        channel = message.channel_type.value
        external_id = normalise_identifier(channel, message.user_identifier)
        known = await self.known_sender(f"{channel}:{external_id}")
        if known is not None:
            return known
        linked = await self._link_by_email(channel, external_id)
        if linked is not None:
            return linked
        if not provisioning_allowed(self.config.identity, message):
            return None
        user_id = provisioned_user_id(channel, external_id)
        org_id = default_org_id(self.config)
        async with self.database.session() as session:
            users = UserRepository(session)
            await users.upsert(user_id, org_id, external_id, provisioned=True)
            await users.link_identity(user_id, channel, external_id)
        log.info("identity.provisioned", user_id=user_id, channel=channel, tenant=message.tenant)
        return self._remember(
            f"{channel}:{external_id}",
            ResolvedUser(user_id, org_id, external_id, provisioned=True),
        )

    def forget_cached(self) -> None:
        """Drop the cached lookups (after a config reload changed identities)."""
        self._cache.clear()
        self._keys_cache.clear()

    async def _link_by_email(self, channel: str, external_id: str) -> ResolvedUser | None:
        """Link the sender to the configured user with the email address the platform reports."""
        lookup = self.email_lookups.get(channel)
        if not self.config.identity.link_by_email or lookup is None:
            return None
        email = await lookup(external_id)
        if not email:
            return None
        async with self.database.session() as session:
            users = UserRepository(session)
            user = await users.find_by_identity("email", normalise_identifier("email", email))
            if user is None or user.provisioned:
                return None
            await users.link_identity(user.id, channel, external_id)
        self._keys_cache.pop(user.id)
        log.info("identity.linked_by_email", user_id=user.id, channel=channel)
        return ResolvedUser(user.id, user.org_id, user.display_name, user.provisioned)

    async def identity_keys(self, user_id: str) -> list[str]:
        """Every sender key of the user: the queues the dispatcher drains for them (cached
        like known senders)."""
        cached = self._keys_cache.get(user_id)
        if cached is not None:
            return cached
        async with self.database.single() as session:
            identities = await UserRepository(session).identities(user_id)
        keys = [f"{identity.channel_type}:{identity.external_id}" for identity in identities]
        self._keys_cache.put(user_id, keys)
        return keys
