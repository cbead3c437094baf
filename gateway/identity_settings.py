"""The identity sections of the configuration schema: organizations, known users and their
channel identities, and who may be provisioned automatically.

`gateway.settings.GatewayConfig` holds them (``organizations:`` and ``identity:``) and checks
the rule across the two (every user belongs to a configured organization); the rules inside
a section are here. `gateway.identity` maps senders to users with them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from primitives.config_types import (
    EmailAddress,
    Identifier,
    Loc,
    NonEmptyStr,
    SlackIdentity,
    StrictModel,
    located_errors,
)


class OrganizationConfig(StrictModel):
    """An organization; its ``context`` is added to the system prompt of its users."""

    id: Identifier
    name: str = ""
    context: str = ""


class ProvisionConfig(StrictModel):
    """Who may be provisioned automatically when ``unknown_users: provision``."""

    slack_team_ids: tuple[NonEmptyStr, ...] = ()
    teams_tenant_ids: tuple[NonEmptyStr, ...] = ()
    email_domains: tuple[NonEmptyStr, ...] = ()


class UserConfig(StrictModel):
    """A known user and the identities that are theirs on each channel."""

    id: Identifier
    org: Identifier | None = None
    name: str = ""
    slack: tuple[SlackIdentity, ...] = ()
    teams: tuple[NonEmptyStr, ...] = ()
    email: tuple[EmailAddress, ...] = ()
    admin: bool = False


class IdentityConfig(StrictModel):
    """How senders are mapped to users, and what happens to senders nobody configured."""

    unknown_users: Literal["reject", "provision"] = "reject"
    link_by_email: bool = False
    provision: ProvisionConfig = Field(default_factory=ProvisionConfig)
    users: tuple[UserConfig, ...] = ()

    @field_validator("users")
    @classmethod
    def _ids_and_identities_unique(cls, users: tuple[UserConfig, ...]) -> tuple[UserConfig, ...]:
        """An id or a channel identity belonging to two users would make routing ambiguous."""
        errors: list[tuple[Loc, str, object]] = []
        first_index: dict[str, int] = {}
        owner: dict[tuple[str, str], str] = {}
        for index, user in enumerate(users):
            if user.id in first_index:
                message = f"duplicate user id {user.id!r} (also users[{first_index[user.id]}])"
                errors.append(((index, "id"), message, user.id))
            first_index.setdefault(user.id, index)
            identities = {
                "slack": user.slack,
                "teams": user.teams,
                "email": tuple(address.lower() for address in user.email),
            }
            for channel, values in identities.items():
                for position, value in enumerate(values):
                    other = owner.setdefault((channel, value), user.id)
                    if other != user.id:
                        message = f"{channel} identity {value!r} already belongs to user {other!r}"
                        errors.append(((index, channel, position), message, value))
        if errors:
            raise located_errors("IdentityConfig", errors)
        return users
