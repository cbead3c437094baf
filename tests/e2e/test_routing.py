"""Routing end to end over the web channel: exactly once, in order, in the right session."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from storage.models import InboundEvent, OutboundMessage, Session, SessionMessage
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway


async def session_rows(gateway: RunningGateway) -> list[Session]:
    async with gateway.runtime.database.session() as db:
        return list((await db.execute(select(Session).order_by(Session.created_at))).scalars())


async def messages_of(gateway: RunningGateway, session_id: str) -> list[SessionMessage]:
    async with gateway.runtime.database.session() as db:
        result = await db.execute(
            select(SessionMessage)
            .where(SessionMessage.session_id == session_id)
            .order_by(SessionMessage.seq)
        )
        return list(result.scalars())


async def test_the_same_message_id_posted_five_times_gets_one_reply(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(gateway_config(database_url, tmp_path)) as gateway:
        answers = [await gateway.post("alice", "hello", message_id="m-1") for _ in range(5)]
        assert [answer.status_code for answer in answers] == [202] * 5
        assert [answer.json()["duplicate"] for answer in answers] == [False] + [True] * 4
        (reply,) = await gateway.wait_for_replies("alice", 1)
        (session,) = await session_rows(gateway)
        messages = await messages_of(gateway, session.id)
    assert reply["in_reply_to"] == "m-1"
    assert reply["session_id"] == session.id
    assert "hello" in reply["text"]
    assert [(m.seq, m.role) for m in messages] == [(1, "user"), (2, "assistant")]


async def test_concurrent_duplicates_are_accepted_once(database_url: str, tmp_path: Path) -> None:
    async with running_gateway(gateway_config(database_url, tmp_path)) as gateway:
        answers = await asyncio.gather(
            *(gateway.post("alice", "hi", message_id="same") for _ in range(10))
        )
        await gateway.wait_for_replies("alice", 1)
        async with gateway.runtime.database.session() as db:
            events = list((await db.execute(select(InboundEvent))).scalars())
    assert sorted(answer.json()["duplicate"] for answer in answers) == [False] + [True] * 9
    assert len(events) == 1


async def test_messages_queued_during_a_turn_are_answered_in_arrival_order(
    database_url: str, tmp_path: Path
) -> None:
    config = gateway_config(database_url, tmp_path, llm={"offline_latency": "400ms"})
    async with running_gateway(config) as gateway:
        await gateway.post("alice", "first", message_id="q1")
        await asyncio.sleep(0.15)  # the first turn is now waiting on the model
        for index in (2, 3, 4):
            await gateway.post("alice", f"message {index}", message_id=f"q{index}")
        replies = await gateway.wait_for_replies("alice", 4)
        (session,) = await session_rows(gateway)
        transcript = await messages_of(gateway, session.id)
    assert [reply["in_reply_to"] for reply in replies] == ["q1", "q2", "q3", "q4"]
    assert [(m.role, m.content) for m in transcript if m.role == "user"] == [
        ("user", "first"),
        ("user", "message 2"),
        ("user", "message 3"),
        ("user", "message 4"),
    ]
    # Turns alternate (never interleave) and each one saw every message before it.
    assert [m.role for m in transcript] == ["user", "assistant"] * 4
    assert [m.seq for m in transcript] == list(range(1, 9))
    for position, reply in enumerate(replies):
        assert f"I can see {2 * position} earlier message(s)" in reply["text"]


async def test_users_are_answered_in_their_own_sessions(database_url: str, tmp_path: Path) -> None:
    async with running_gateway(gateway_config(database_url, tmp_path)) as gateway:
        await asyncio.gather(
            *(gateway.post(user, f"{user} {n}") for user in ("alice", "bob") for n in range(3))
        )
        alice = await gateway.wait_for_replies("alice", 3)
        bob = await gateway.wait_for_replies("bob", 3)
        sessions = await session_rows(gateway)
    assert len(sessions) == 2
    assert {s.user_id for s in sessions} == {"alice", "bob"}
    assert len({reply["session_id"] for reply in alice}) == 1
    assert all("«alice" in reply["text"] for reply in alice)
    assert all("«bob" in reply["text"] for reply in bob)


async def test_an_idle_session_is_archived_and_resume_brings_it_back(
    database_url: str, tmp_path: Path
) -> None:
    config = gateway_config(database_url, tmp_path, sessions={"archive_after": "1h"})
    async with running_gateway(config) as gateway:
        await gateway.post("alice", "before the break")
        (first_reply,) = await gateway.wait_for_replies("alice", 1)
        old_session = first_reply["session_id"]
        await gateway.wait_for_turns_to_end("alice")

        gateway.clock.advance(timedelta(hours=2))
        assert await gateway.runtime.jobs.archive_idle_sessions() == 1
        (archived,) = await session_rows(gateway)
        assert archived.status == "archived"

        await gateway.post("alice", "after the break")
        replies = await gateway.wait_for_replies("alice", 2)
        new_session = replies[1]["session_id"]
        assert new_session != old_session

        await gateway.post("alice", f"/resume {old_session[:8]}")
        replies = await gateway.wait_for_replies("alice", 3)
        assert replies[2]["text"].startswith(f"Resumed session {old_session[:8]}")
        await gateway.post("alice", "back again")
        replies = await gateway.wait_for_replies("alice", 4)
        statuses = {s.id: s.status for s in await session_rows(gateway)}
    assert replies[3]["session_id"] == old_session
    assert statuses == {old_session: "active", new_session: "archived"}


async def test_a_message_after_archive_after_starts_a_new_session_even_before_the_job(
    database_url: str, tmp_path: Path
) -> None:
    config = gateway_config(database_url, tmp_path, sessions={"archive_after": "1h"})
    async with running_gateway(config) as gateway:
        await gateway.post("alice", "one")
        await gateway.wait_for_replies("alice", 1)
        gateway.clock.advance(timedelta(minutes=61))
        await gateway.post("alice", "two")
        replies = await gateway.wait_for_replies("alice", 2)
        sessions = await session_rows(gateway)
    assert replies[0]["session_id"] != replies[1]["session_id"]
    assert [s.status for s in sessions] == ["archived", "active"]


async def test_a_thread_stays_with_its_session(database_url: str, tmp_path: Path) -> None:
    async with running_gateway(gateway_config(database_url, tmp_path)) as gateway:
        await gateway.post("alice", "start a thread", thread_id="t-1")
        (first,) = await gateway.wait_for_replies("alice", 1)
        await gateway.post("alice", "/new")
        await gateway.wait_for_replies("alice", 2)
        await gateway.post("alice", "back in the thread", thread_id="t-1")
        await gateway.post("alice", "not in a thread")
        replies = await gateway.wait_for_replies("alice", 4)
    assert first["thread_id"] == "t-1"
    assert replies[2]["thread_id"] == "t-1"
    assert replies[2]["session_id"] == first["session_id"]
    assert replies[3]["session_id"] != first["session_id"]


async def test_channel_scope_keeps_one_session_per_channel(tmp_path: Path) -> None:
    config = gateway_config(
        f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}", tmp_path, sessions={"scope": "channel"}
    )
    async with running_gateway(config) as gateway:
        await gateway.post("alice", "on the web")
        (reply,) = await gateway.wait_for_replies("alice", 1)
        (session,) = await session_rows(gateway)
    assert session.scope_channel == "web"
    assert reply["session_id"] == session.id


async def test_an_unknown_sender_is_told_once_and_never_routed(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(gateway_config(database_url, tmp_path)) as gateway:
        for index in range(3):
            assert (await gateway.post("mallory", f"let me in {index}")).status_code == 202
        (notice,) = await gateway.wait_for_replies("mallory", 1)
        await asyncio.sleep(0.3)
        async with gateway.runtime.database.session() as db:
            statuses = sorted((await db.execute(select(InboundEvent.status))).scalars())
            outbound = list((await db.execute(select(OutboundMessage))).scalars())
        sessions = await session_rows(gateway)
    assert "not enabled" in notice["text"]
    assert statuses == ["rejected"] * 3
    assert [row.kind for row in outbound] == ["rejection"]
    assert sessions == []


async def test_a_turn_cut_short_at_shutdown_is_answered_after_the_restart(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
    async with running_gateway(gateway_config(url, tmp_path, llm={"offline_latency": "1h"})) as gw:
        await gw.post("alice", "are you there?", message_id="s1")
        for _ in range(100):
            if await session_rows(gw):
                break
            await asyncio.sleep(0.05)
        await gw.runtime.dispatcher.stop(grace=0.2)  # the model is still "thinking"
        async with gw.runtime.database.session() as db:
            (event,) = (await db.execute(select(InboundEvent))).scalars()
        (session,) = await session_rows(gw)
        # Nothing of the turn is stored before its answer: no half-turn to repair.
        assert (event.status, event.appended_seq) == ("pending", None)
        assert await messages_of(gw, session.id) == []
    async with running_gateway(gateway_config(url, tmp_path)) as gateway:
        (reply,) = await gateway.wait_for_replies("alice", 1)
        (session,) = await session_rows(gateway)
        transcript = await messages_of(gateway, session.id)
        async with gateway.runtime.database.session() as db:
            (event,) = (await db.execute(select(InboundEvent))).scalars()
    assert reply["in_reply_to"] == "s1"
    assert [m.role for m in transcript] == ["user", "assistant"]
    assert (event.status, event.appended_seq, event.session_id) == ("done", 1, session.id)


async def test_export_gives_a_24_hour_link_to_the_users_own_session(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(gateway_config(database_url, tmp_path)) as gateway:
        await gateway.post("alice", "remember the anvil order")
        (answer,) = await gateway.wait_for_replies("alice", 1)
        await gateway.post("bob", "bob's own words")
        await gateway.wait_for_replies("bob", 1)
        await gateway.post("alice", "/export")
        replies = await gateway.wait_for_replies("alice", 2)
        link = replies[1]["text"].rsplit(" ", 1)[1]
        assert link.startswith("/web/v1/exports/")

        download = await gateway.client.get(link)
        assert download.status_code == 200
        assert "attachment" in download.headers["content-disposition"]
        data = download.json()
        assert data["session_id"] == answer["session_id"]
        assert data["user_id"] == "alice"
        assert data["messages"][0]["content"] == "remember the anvil order"
        assert "bob's own words" not in download.text
        assert data["channels"] == [
            {"channel_type": "web", "channel_id": "alice", "thread_id": None}
        ]

        assert (await gateway.client.get(link + "x")).status_code == 404
        gateway.clock.advance(timedelta(hours=25))
        expired = await gateway.client.get(link)
        metrics = (await gateway.client.get("/metrics")).text
    assert expired.status_code == 404
    assert expired.json() == {"error": "unknown or expired export link"}
    assert link.rsplit("/", 1)[1] not in metrics
