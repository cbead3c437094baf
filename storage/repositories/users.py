"""Organizations, users and their channel identities.

Who may talk to the assistant and under which platform ids (Slack `TEAM:USER`, AAD object id,
email address, web id). An identity belongs to one user and is never moved silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
from storage import driver_rows
from storage.column_types import utcnow
from storage.models import Organization, User, UserChannelIdentity
from storage.repositories._sql import batches, dialect_insert


@dataclass(frozen=True, slots=True)
class UserFields:
    """What `UserRepository.upsert_many` writes of a user (a configured one, mostly)."""

    user_id: str
    org_id: str
    display_name: str
    is_admin: bool = False


@dataclass(frozen=True, slots=True)
class SenderOwner:
    """The user a channel identity belongs to, with all their sender keys
    (`channel:external id`)."""

    user_id: str
    org_id: str
    display_name: str
    provisioned: bool
    sender_keys: tuple[str, ...]


# The owner of one identity with every identity of theirs. Written as text for the driver: the
# ORM built this join's aliases (and their column collections) anew for every lookup, about
# a millisecond of CPU for each new sender.
_SENDER = """SELECT u.id, u.org_id, u.display_name, u.provisioned, every.channel_type,
    every.external_id
    FROM user_channel_identities found
    JOIN users u ON u.id = found.user_id
    JOIN user_channel_identities every ON every.user_id = u.id
    WHERE found.channel_type = :channel_type AND found.external_id = :external_id
    ORDER BY every.channel_type, every.external_id"""


async def sender_owner(
    db: driver_rows.DriverScope, channel_type: str, external_id: str
) -> SenderOwner | None:
    """The user owning this channel identity with every identity of theirs, in one
    statement (a new sender costs the dispatcher one round trip, not two)."""
    rows = await driver_rows.rows(
        db, _SENDER, {"channel_type": channel_type, "external_id": external_id}
    )
    if not rows:
        return None
    user_id, org_id, display_name, provisioned = rows[0][:4]
    return SenderOwner(
        user_id,
        org_id,
        display_name,
        bool(provisioned),
        tuple(f"{channel}:{external}" for *_, channel, external in rows),
    )


def identity_conflict(channel_type: str, external_id: str, owner: str) -> str:
    """Why an identity could not be linked: another user has it."""
    return f"{channel_type} identity {external_id!r} already belongs to user {owner!r}"


class OrganizationRepository:
    """Organizations (tenants)."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def upsert(self, org_id: str, name: str, context: str = "") -> None:
        """Create the organization or update its name and context."""
        statement = dialect_insert(self.session, Organization).values(
            id=org_id, name=name, context=context, created_at=utcnow()
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[Organization.id], set_={"name": name, "context": context}
            )
        )

    async def get(self, org_id: str) -> Organization | None:
        """The organization, or None."""
        return await self.session.get(Organization, org_id)


class UserRepository:
    """Users and their channel identities."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def upsert(
        self,
        user_id: str,
        org_id: str,
        display_name: str = "",
        *,
        is_admin: bool = False,
        provisioned: bool = False,
    ) -> None:
        """Create the user or update its organization, name and admin flag."""
        await self.upsert_many(
            [UserFields(user_id, org_id, display_name, is_admin)], provisioned=provisioned
        )

    async def upsert_many(self, users: Sequence[UserFields], *, provisioned: bool = False) -> None:
        """`upsert` for many users (ids distinct): one statement, run for all of them by the
        driver (`executemany`) instead of a round trip per user; the configured users are
        written at every start and reload. A user already there keeps `provisioned`."""
        if not users:
            return
        now = utcnow()
        statement = dialect_insert(self.session, User.__table__)
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[User.id],
                set_={
                    "org_id": statement.excluded.org_id,
                    "display_name": statement.excluded.display_name,
                    "is_admin": statement.excluded.is_admin,
                },
            ),
            [
                {
                    "id": user.user_id,
                    "org_id": user.org_id,
                    "display_name": user.display_name,
                    "is_admin": user.is_admin,
                    "provisioned": provisioned,
                    "created_at": now,
                }
                for user in users
            ],
        )

    async def get(self, user_id: str) -> User | None:
        """The user, or None."""
        return await self.session.get(User, user_id)

    async def link_identity(self, user_id: str, channel_type: str, external_id: str) -> None:
        """Map (channel type, external id) to the user.

        An identity already linked to a different user is an error, never silently moved: that
        would hand one person's conversations to another.
        """
        conflicts = await self.link_identities([(user_id, channel_type, external_id)])
        if conflicts:
            raise StorageError(identity_conflict(*conflicts[0][1:]))

    async def link_identities(
        self, identities: Sequence[tuple[str, str, str]]
    ) -> list[tuple[str, str, str, str]]:
        """Map many (user id, channel type, external id) at once, in batches.

        Identities already linked to a different user are left as they are (never moved, as
        in `link_identity`) and returned with their owner: (user id, channel type, external
        id, owner id).
        """
        if not identities:
            return []
        now = utcnow()
        # One statement compiled once, run for every identity (`executemany`).
        await self.session.execute(
            dialect_insert(self.session, UserChannelIdentity.__table__).on_conflict_do_nothing(
                index_elements=["channel_type", "external_id"]
            ),
            [
                {
                    "user_id": user_id,
                    "channel_type": channel_type,
                    "external_id": external_id,
                    "created_at": now,
                }
                for user_id, channel_type, external_id in identities
            ],
        )
        owners: dict[tuple[str, str], str] = {}
        for batch in batches(identities):
            result = await self.session.execute(
                select(
                    UserChannelIdentity.channel_type,
                    UserChannelIdentity.external_id,
                    UserChannelIdentity.user_id,
                ).where(
                    tuple_(UserChannelIdentity.channel_type, UserChannelIdentity.external_id).in_(
                        [(channel_type, external_id) for _, channel_type, external_id in batch]
                    )
                )
            )
            owners.update({(row[0], row[1]): row[2] for row in result})
        return [
            (user_id, channel_type, external_id, owners.get((channel_type, external_id), "?"))
            for user_id, channel_type, external_id in identities
            if owners.get((channel_type, external_id)) != user_id
        ]

    async def unlink_identity(self, user_id: str, channel_type: str, external_id: str) -> bool:
        """Remove the user's identity (channel type, external id); False if they had none."""
        result = await self.session.execute(
            delete(UserChannelIdentity).where(
                UserChannelIdentity.user_id == user_id,
                UserChannelIdentity.channel_type == channel_type,
                UserChannelIdentity.external_id == external_id,
            )
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def find_by_identity(self, channel_type: str, external_id: str) -> User | None:
        """The user that owns this channel identity, or None."""
        result = await self.session.execute(
            select(User)
            .join(UserChannelIdentity, UserChannelIdentity.user_id == User.id)
            .where(
                UserChannelIdentity.channel_type == channel_type,
                UserChannelIdentity.external_id == external_id,
            )
        )
        return result.scalar_one_or_none()

    async def identities(self, user_id: str) -> list[UserChannelIdentity]:
        """Every channel identity of the user."""
        result = await self.session.execute(
            select(UserChannelIdentity)
            .where(UserChannelIdentity.user_id == user_id)
            .order_by(UserChannelIdentity.channel_type, UserChannelIdentity.external_id)
        )
        return list(result.scalars())

    async def delete(self, user_id: str) -> bool:
        """Delete the user and, by cascade, everything that belongs to them."""
        result = await self.session.execute(delete(User).where(User.id == user_id))
        return bool(result.rowcount)  # type: ignore[attr-defined]
