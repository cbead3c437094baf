"""Teams end to end: activities with real JWTs in, replies at a fake Bot Connector out, a whole
gateway in between."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from storage.models import ExportLink, InboundEvent, SessionChannel, SessionMessage
from tests.channels.teams_activities import (
    ALICE_AAD,
    TEAM_CHANNEL,
    TENANT,
    channel_mention,
    personal_message,
)
from tests.e2e.harness import gateway_config, running_gateway
from tests.fakes.bot_framework import APP_ID, APP_PASSWORD, FakeBotFramework, PostedActivity


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotFramework]:
    async with FakeBotFramework() as server:
        yield server


def teams_config(database_url: str, tmp_path: Path, fake: FakeBotFramework) -> Any:
    return gateway_config(
        database_url,
        tmp_path,
        identity={"users": [{"id": "alice", "org": "acme", "teams": [ALICE_AAD]}]},
        channels={
            "teams": {
                "enabled": True,
                "app_id": APP_ID,
                "app_password": APP_PASSWORD,
                "tenant_ids": [TENANT],
                "openid_metadata_url": fake.openid_metadata_url,
                "oauth_token_url": fake.token_url,
            }
        },
    )


async def wait_for_posts(fake: FakeBotFramework, count: int) -> list[PostedActivity]:
    deadline = time.monotonic() + 15
    while len(fake.posted) < count:
        assert time.monotonic() < deadline, f"{len(fake.posted)} of {count} replies"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.4)  # a duplicate would show up now
    assert len(fake.posted) == count, fake.posted
    return list(fake.posted)


async def test_a_personal_message_gets_one_reply_in_its_conversation_also_when_resent(
    database_url: str, tmp_path: Path, fake: FakeBotFramework
) -> None:
    activity = personal_message(fake, "what is an anvil?")
    async with running_gateway(teams_config(database_url, tmp_path, fake)) as gateway:
        answers = [
            await gateway.client.post("/api/messages", json=activity, headers=fake.bearer())
            for _ in range(3)
        ]
        (posted,) = await wait_for_posts(fake, 1)
        async with gateway.runtime.database.session() as db:
            events = list((await db.execute(select(InboundEvent))).scalars())
    assert [answer.status_code for answer in answers] == [200] * 3
    assert len(events) == 1
    assert posted.conversation_id == activity["conversation"]["id"]
    assert posted.reply_to_id == activity["id"]
    assert "what is an anvil?" in posted.body["text"]


async def test_a_channel_mention_is_answered_in_its_reply_chain_and_recorded_as_a_thread(
    database_url: str, tmp_path: Path, fake: FakeBotFramework
) -> None:
    activity = channel_mention(fake, root="1717243100000")
    async with running_gateway(teams_config(database_url, tmp_path, fake)) as gateway:
        answer = await gateway.client.post("/api/messages", json=activity, headers=fake.bearer())
        (posted,) = await wait_for_posts(fake, 1)
        async with gateway.runtime.database.session() as db:
            channels = list((await db.execute(select(SessionChannel))).scalars())
            messages = list((await db.execute(select(SessionMessage))).scalars())
    assert answer.status_code == 200
    assert posted.conversation_id == f"{TEAM_CHANNEL};messageid=1717243100000"
    assert [(c.channel_type, c.channel_id, c.thread_id) for c in channels] == [
        ("teams", TEAM_CHANNEL, "1717243100000")
    ]
    assert messages[0].content == "what is the status?"


async def test_an_activity_without_a_valid_token_never_reaches_the_session(
    database_url: str, tmp_path: Path, fake: FakeBotFramework
) -> None:
    activity = personal_message(fake)
    async with running_gateway(teams_config(database_url, tmp_path, fake)) as gateway:
        unsigned = await gateway.client.post("/api/messages", json=activity)
        wrong_audience = await gateway.client.post(
            "/api/messages", json=activity, headers=fake.bearer(audience="someone-else")
        )
        async with gateway.runtime.database.session() as db:
            events = list((await db.execute(select(InboundEvent))).scalars())
    assert (unsigned.status_code, wrong_audience.status_code) == (401, 401)
    assert events == []
    assert fake.posted == []


async def test_export_in_a_channel_is_refused_in_its_reply_chain_and_makes_no_link(
    database_url: str, tmp_path: Path, fake: FakeBotFramework
) -> None:
    activity = channel_mention(fake, root="1717243100000")
    activity["text"] = "<at>Assistant</at> /export"
    async with running_gateway(teams_config(database_url, tmp_path, fake)) as gateway:
        answer = await gateway.client.post("/api/messages", json=activity, headers=fake.bearer())
        (posted,) = await wait_for_posts(fake, 1)
        async with gateway.runtime.database.session() as db:
            links = list((await db.execute(select(ExportLink))).scalars())
    assert answer.status_code == 200
    assert posted.conversation_id == f"{TEAM_CHANNEL};messageid=1717243100000"
    assert "only send them in a direct message" in posted.body["text"]
    assert "/web/v1/exports/" not in posted.body["text"]
    assert links == []
