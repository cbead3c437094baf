"""Identities: configured users synced to the database, lookups, and provisioning."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import structlog
from sqlalchemy import event, select

from channels.base import ChannelMessage, ChannelType
from gateway.identity import IdentityResolver, ResolvedUser, provisioned_user_id, sync_identities
from gateway.inbox import sender_key
from gateway.log import configure_logging
from gateway.settings import GatewayConfig
from storage import driver_rows
from storage.database import Database
from storage.driver_rows import DriverScope
from storage.models import Organization, User, UserChannelIdentity
from storage.repositories.users import OrganizationRepository, UserRepository

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def config(*, acme_context: str = "Acme makes anvils.", **identity: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "organizations": [
                {"id": "acme", "name": "Acme", "context": acme_context},
                {"id": "globex", "name": "Globex"},
            ],
            "identity": {
                "users": [
                    {
                        "id": "alice",
                        "org": "acme",
                        "name": "Alice",
                        "slack": ["T0001:U0001"],
                        "teams": ["aad-alice"],
                        "email": ["Alice@Acme.Example"],
                        "admin": True,
                    },
                    {"id": "bob", "org": "globex", "name": "Bob"},
                ],
                **identity,
            },
        }
    )


def message(channel: ChannelType, sender: str, *, tenant: str = "") -> ChannelMessage:
    return ChannelMessage(
        channel_type=channel,
        channel_id=sender,
        message_id=f"m-{channel}-{sender}",
        user_identifier=sender,
        content="hello",
        timestamp=NOW,
        tenant=tenant,
    )


async def identities(database: Database) -> list[tuple[str, str, str]]:
    async with database.session() as db:
        rows = (await db.execute(select(UserChannelIdentity))).scalars()
        return sorted((row.user_id, row.channel_type, row.external_id) for row in rows)


async def users(database: Database) -> dict[str, tuple[str, str, bool, bool]]:
    async with database.session() as db:
        rows = (await db.execute(select(User))).scalars()
        return {
            row.id: (row.org_id, row.display_name, row.is_admin, row.provisioned) for row in rows
        }


@pytest.fixture
def log_lines(capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """The JSON log lines written so far (the gateway's own logging set-up, on stderr)."""
    configure_logging("json", "debug")

    def read() -> list[dict[str, Any]]:
        err = capsys.readouterr().err
        return [json.loads(line) for line in err.splitlines() if line.startswith("{")]

    yield read
    structlog.reset_defaults()
    logging.getLogger().handlers.clear()


async def organizations(database: Database) -> dict[str, tuple[str, str]]:
    async with database.session() as db:
        rows = (await db.execute(select(Organization))).scalars()
        return {row.id: (row.name, row.context) for row in rows}


async def test_sync_writes_organizations_users_and_every_identity(database: Database) -> None:
    # (Another test module leaves an organization behind in the shared PostgreSQL database;
    # compare what this sync added.)
    before = await organizations(database)

    await sync_identities(database, config())

    after = await organizations(database)
    assert set(after) - set(before) == {"acme", "globex"}
    assert after["acme"] == ("Acme", "Acme makes anvils.")
    assert after["globex"] == ("Globex", "")
    assert await users(database) == {
        "alice": ("acme", "Alice", True, False),
        "bob": ("globex", "Bob", False, False),
    }
    assert await identities(database) == [
        ("alice", "email", "alice@acme.example"),
        ("alice", "slack", "T0001:U0001"),
        ("alice", "teams", "aad-alice"),
        ("alice", "web", "alice"),
        ("bob", "web", "bob"),
    ]


async def test_sync_is_idempotent_and_picks_up_a_changed_context(database: Database) -> None:
    await sync_identities(database, config())
    first = (await users(database), await identities(database))
    await sync_identities(database, config())
    assert (await users(database), await identities(database)) == first

    await sync_identities(database, config(acme_context="Anvils, since 1949."))

    assert (await users(database), await identities(database)) == first
    orgs = await organizations(database)
    assert (orgs["acme"], orgs["globex"]) == (("Acme", "Anvils, since 1949."), ("Globex", ""))


def many_users(count: int, *, renamed: int = 0) -> GatewayConfig:
    """`count` configured users in Globex; the first `renamed` of them renamed, moved to Acme
    and made admins."""
    renamed_user = {"org": "acme", "name": "Renamed", "admin": True}
    return GatewayConfig.model_validate(
        {
            "organizations": [{"id": "acme", "name": "Acme"}, {"id": "globex", "name": "Globex"}],
            "identity": {
                "users": [
                    {"id": f"user-{number:04d}", "org": "globex", "name": f"User {number}"}
                    | (renamed_user if number < renamed else {})
                    for number in range(count)
                ]
            },
        }
    )


async def test_sync_writes_many_users_in_one_statement_and_updates_changed_ones(
    database: Database,
) -> None:
    # A user the gateway provisioned earlier, then added to the config: still provisioned.
    async with database.session() as db:
        await OrganizationRepository(db).upsert("globex", "Globex")
        await UserRepository(db).upsert("user-0001", "globex", "Was provisioned", provisioned=True)
    executions: list[tuple[str, bool]] = []
    listen = event.listens_for(database.engine.sync_engine, "before_cursor_execute")

    @listen
    def count(*args: Any) -> None:
        statement, many = args[2], args[5]
        executions.append((statement.lstrip().split("(")[0].upper().strip(), many))

    await sync_identities(database, many_users(1_200))

    # One statement run for every user by the driver, not a statement per user.
    assert [many for kind, many in executions if kind == "INSERT INTO USERS"] == [True]
    assert [many for kind, many in executions if kind == "INSERT INTO USER_CHANNEL_IDENTITIES"] == [
        True
    ]
    written = await users(database)
    assert len(written) == 1_200
    assert written["user-0000"] == ("globex", "User 0", False, False)
    assert written["user-0001"] == ("globex", "User 1", False, True)
    assert written["user-1199"] == ("globex", "User 1199", False, False)

    await sync_identities(database, many_users(1_200, renamed=600))

    changed = await users(database)
    assert changed["user-0000"] == ("acme", "Renamed", True, False)
    assert changed["user-0001"] == ("acme", "Renamed", True, True)
    assert changed["user-0599"] == ("acme", "Renamed", True, False)
    assert changed["user-0600"] == ("globex", "User 600", False, False)
    assert len(changed) == 1_200


async def test_sync_without_organizations_creates_the_default_one(database: Database) -> None:
    plain = GatewayConfig.model_validate({"identity": {"users": [{"id": "carol"}]}})
    await sync_identities(database, plain)
    assert (await organizations(database))["default"] == ("Default", "")
    assert await users(database) == {"carol": ("default", "", False, False)}
    assert await identities(database) == [("carol", "web", "carol")]


async def test_an_identity_owned_by_another_user_is_logged_and_left_alone(
    database: Database, log_lines: Any
) -> None:
    async with database.session() as db:
        repository = UserRepository(db)
        await db.merge(Organization(id="acme", name="Acme", context=""))
        await repository.upsert("email-owner", "acme", "someone", provisioned=True)
        await repository.link_identity("email-owner", "email", "alice@acme.example")
    log_lines()  # forget the set-up's lines

    await sync_identities(database, config())

    async with database.session() as db:
        owner = await UserRepository(db).find_by_identity("email", "alice@acme.example")
    assert owner is not None
    assert owner.id == "email-owner"
    assert ("alice", "slack", "T0001:U0001") in await identities(database)
    assert ("alice", "web", "alice") in await identities(database)
    (conflict,) = [line for line in log_lines() if line["event"] == "identity.conflict"]
    assert conflict["level"] == "error"
    assert conflict["user_id"] == "alice"
    assert conflict["channel"] == "email"
    assert "email-owner" in conflict["error"]


async def test_a_configured_user_is_found_by_any_of_their_identities(database: Database) -> None:
    await sync_identities(database, config())
    resolver = IdentityResolver(database, config())
    alice = ResolvedUser("alice", "acme", "Alice", provisioned=False)

    assert await resolver.resolve(message(ChannelType.WEB, "alice")) == alice
    assert await resolver.resolve(message(ChannelType.SLACK, "T0001:U0001")) == alice
    assert await resolver.resolve(message(ChannelType.TEAMS, "aad-alice")) == alice
    assert await resolver.resolve(message(ChannelType.EMAIL, " ALICE@acme.example ")) == alice
    assert await resolver.resolve(message(ChannelType.SLACK, "T0001:u0001")) is None


PROVISION = {"unknown_users": "provision", "provision": {"email_domains": ["Partner.Example"]}}


async def test_provisioning_creates_an_email_sender_of_an_allowed_domain_with_a_stable_id(
    database: Database,
) -> None:
    settings = config(**PROVISION)
    await sync_identities(database, settings)

    first = await IdentityResolver(database, settings).resolve(
        message(ChannelType.EMAIL, "Dana@Partner.example")
    )
    again = await IdentityResolver(database, settings).resolve(
        message(ChannelType.EMAIL, "dana@partner.example")
    )

    expected_id = provisioned_user_id("email", "dana@partner.example")
    assert re.fullmatch(r"email-[0-9a-f]{16}", expected_id)
    assert first == ResolvedUser(expected_id, "acme", "dana@partner.example", provisioned=True)
    assert again == first
    assert (await users(database))[expected_id] == ("acme", "dana@partner.example", False, True)
    assert (expected_id, "email", "dana@partner.example") in await identities(database)


@pytest.mark.parametrize(
    ("channel", "sender", "tenant"),
    [
        (ChannelType.EMAIL, "eve@elsewhere.example", ""),
        (ChannelType.EMAIL, "eve@partner.example.evil.example", ""),
        (ChannelType.EMAIL, "eve@sub.partner.example", ""),
        (ChannelType.WEB, "eve", ""),
        (ChannelType.SLACK, "T9999:U0009", "T9999"),
        (ChannelType.TEAMS, "aad-eve", "tenant-eve"),
    ],
    ids=["other-domain", "suffix-domain", "subdomain", "web", "slack", "teams"],
)
async def test_provisioning_refuses_senders_off_the_allow_list(
    database: Database, channel: ChannelType, sender: str, tenant: str
) -> None:
    settings = config(**PROVISION)
    await sync_identities(database, settings)
    before = await users(database)

    resolved = await IdentityResolver(database, settings).resolve(
        message(channel, sender, tenant=tenant)
    )

    assert resolved is None
    assert await users(database) == before


async def test_in_reject_mode_an_unknown_sender_gets_no_user(database: Database) -> None:
    settings = config(unknown_users="reject", provision={"email_domains": ["partner.example"]})
    await sync_identities(database, settings)
    before = await identities(database)

    resolver = IdentityResolver(database, settings)
    assert await resolver.resolve(message(ChannelType.EMAIL, "dana@partner.example")) is None
    assert await resolver.resolve(message(ChannelType.WEB, "mallory")) is None
    assert await identities(database) == before


async def test_identity_keys_list_every_sender_key_of_the_user(database: Database) -> None:
    settings = config()
    await sync_identities(database, settings)
    resolver = IdentityResolver(database, settings)

    assert await resolver.identity_keys("alice") == [
        "email:alice@acme.example",
        "slack:T0001:U0001",
        "teams:aad-alice",
        "web:alice",
    ]
    assert await resolver.identity_keys("bob") == ["web:bob"]
    # The keys are the inbox's sender keys: every identity's messages join the user's queue.
    for channel, sender in [
        (ChannelType.EMAIL, " Alice@ACME.example"),
        (ChannelType.SLACK, "T0001:U0001"),
        (ChannelType.TEAMS, "aad-alice"),
        (ChannelType.WEB, "alice"),
    ]:
        assert sender_key(channel.value, sender) in await resolver.identity_keys("alice")
    assert await resolver.identity_keys("nobody") == []


async def test_looking_a_sender_up_reads_their_user_and_every_queue_in_one_statement(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = config()
    await sync_identities(database, settings)
    resolver = IdentityResolver(database, settings)
    statements: list[str] = []
    listen = event.listens_for(database.engine.sync_engine, "before_cursor_execute")

    @listen
    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    run_statement = driver_rows.rows

    async def counted(db: DriverScope, sql: str, *args: Any, **kwargs: Any) -> Any:
        statements.append(sql)
        return await run_statement(db, sql, *args, **kwargs)

    monkeypatch.setattr(driver_rows, "rows", counted)
    alice = await resolver.known_sender("slack:T0001:U0001")
    keys = await resolver.identity_keys("alice")

    assert alice == ResolvedUser("alice", "acme", "Alice", provisioned=False)
    assert keys == ["email:alice@acme.example", "slack:T0001:U0001", "teams:aad-alice", "web:alice"]
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 1
    assert await resolver.known_sender("slack:T0001:U9999") is None
