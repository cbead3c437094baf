"""Where a command is asked matters: exports are made only in private conversations, and
/sessions and /status leave out topics and channels in shared ones."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from structlog.testing import capture_logs

from channels.base import ChannelMessage, Conversation
from channels.registry import channel_plugin
from gateway.commands import (
    EXPORT_ONLY_IN_PRIVATE,
    CommandContext,
    CommandOutcome,
    is_private_conversation,
    parse_command,
    run_command,
)
from gateway.identity import ResolvedUser
from gateway.turn_values import arrival_of
from sessions.routing import RoutingPolicy
from storage.database import Database
from storage.local_transcripts import LocalTranscriptStore
from storage.models import ExportLink, Session
from storage.repositories.sessions import SessionRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from tests.gateway.command_messages import (
    NOW,
    PRIVATE_PLACES,
    SHARED_PLACES,
    slack_dm,
    slack_shortcut,
    teams_message,
)

ALICE = ResolvedUser("alice", "acme", "Alice")
POLICY = RoutingPolicy(scope="user", archive_after=timedelta(hours=8))
DM_SECRET = "the vault code is PLUM-4471"


@pytest.mark.parametrize("place", PRIVATE_PLACES)
def test_dms_personal_chats_email_and_the_web_are_private(place: str) -> None:
    assert is_private_conversation(PRIVATE_PLACES[place]("/export"))


def test_the_dm_a_slack_shortcut_is_answered_in_is_private() -> None:
    message = slack_shortcut()
    assert message.channel_id == "U0001"  # Slack delivers a post to a user id to the app's DM
    assert is_private_conversation(message)


@pytest.mark.parametrize("place", SHARED_PLACES)
def test_channels_group_chats_and_group_dms_are_shared(place: str) -> None:
    assert not is_private_conversation(SHARED_PLACES[place]("/export"))


def test_a_conversation_not_known_to_be_private_counts_as_shared() -> None:
    unmarked = teams_message("/export", {"id": "a:1chat", "conversationType": ""})
    assert unmarked.conversation is not Conversation.DIRECT
    assert not is_private_conversation(unmarked)
    # A message built without saying where it came from (or stored before the field existed).
    assert not is_private_conversation(
        replace(slack_dm("/export"), conversation=Conversation.CHANNEL)
    )
    record = slack_dm("/export").to_record()
    del record["conversation"]
    assert not is_private_conversation(ChannelMessage.from_record(record))


@pytest.fixture
async def alices_database(tmp_path: Path) -> AsyncIterator[Database]:
    """A database where Alice's one session holds a DM and a thread in channel C0001."""
    database = Database(f"sqlite+aiosqlite:///{tmp_path / 'commands.db'}")
    await database.upgrade()
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("alice", "acme", "Alice")
        sessions = SessionRepository(db)
        session = await sessions.create("alice", "acme", at=NOW)
        session.topic_summary = DM_SECRET
        await sessions.record_channel(session.id, "slack", "D0001", "", at=NOW)
        await sessions.record_channel(session.id, "slack", "C0001", "1700000001.000100", at=NOW)
        await sessions.append_message(
            session.id, role="user", channel_type="slack", content=DM_SECRET, at=NOW
        )
    yield database
    await database.dispose()


async def run_as_alice(
    database: Database, message: ChannelMessage, tmp_path: Path
) -> tuple[CommandOutcome, list[ExportLink]]:
    """Run the message's command for Alice; the reply and the export links that exist after."""
    command = parse_command(message)
    assert command is not None
    async with database.session() as db:
        outcome = await run_command(
            command,
            CommandContext(
                db=db,
                user=ALICE,
                arrival=arrival_of(message, ALICE),
                message=message,
                policy=POLICY,
                history_budget_tokens=1000,
                now=NOW,
                transcripts=LocalTranscriptStore(tmp_path / "transcripts"),
                public_url="https://gateway.example",
            ),
        )
    async with database.session() as db:
        links = list((await db.execute(select(ExportLink))).scalars())
    return outcome, links


@pytest.mark.parametrize("place", SHARED_PLACES)
@pytest.mark.parametrize("command", ["/export", "/export {session_id}"])
async def test_an_export_asked_for_in_a_shared_conversation_is_refused_and_nothing_is_made(
    alices_database: Database, tmp_path: Path, place: str, command: str
) -> None:
    async with alices_database.session() as db:
        (session,) = (await db.execute(select(Session))).scalars()
    message = SHARED_PLACES[place](command.format(session_id=session.id[:8]))
    with capture_logs() as logged:
        outcome, links = await run_as_alice(alices_database, message, tmp_path)

    assert outcome == CommandOutcome(EXPORT_ONLY_IN_PRIVATE)
    assert "only send them in a direct message" in outcome.reply
    assert "/web/v1/exports/" not in outcome.reply
    assert links == []
    (refusal,) = [line for line in logged if line["event"] == "export.refused"]
    assert refusal["reason"] == "shared conversation"
    assert refusal["user_id"] == "alice"
    assert refusal["channel_id"] == message.channel_id


@pytest.mark.parametrize("place", PRIVATE_PLACES)
async def test_an_export_asked_for_in_a_private_conversation_is_made(
    alices_database: Database, tmp_path: Path, place: str
) -> None:
    message = PRIVATE_PLACES[place]("/export")
    outcome, links = await run_as_alice(alices_database, message, tmp_path)

    (link,) = links
    assert link.user_id == "alice"
    assert outcome.session_id == link.session_id
    assert "https://gateway.example/web/v1/exports/" in outcome.reply
    if channel_plugin(message.channel_type).delivers_files:
        assert outcome.file is not None
        assert DM_SECRET in outcome.file.content
    else:
        assert outcome.file is None


@pytest.mark.parametrize("place", SHARED_PLACES)
async def test_sessions_and_status_in_a_shared_conversation_leave_out_topics_and_channels(
    alices_database: Database, tmp_path: Path, place: str
) -> None:
    listing, _ = await run_as_alice(alices_database, SHARED_PLACES[place]("/sessions"), tmp_path)
    status, _ = await run_as_alice(alices_database, SHARED_PLACES[place]("/status"), tmp_path)

    assert "PLUM-4471" not in listing.reply
    assert "Topics are shown only in a direct message." in listing.reply
    assert re.search(r"^\* [0-9a-f]{8}  .*  active  +1 msgs$", listing.reply, re.M)
    assert "D0001" not in status.reply
    assert "Channels: 2 (listed only in a direct message)" in status.reply
    assert "Messages: 1 (1 from you, 0 from the assistant)" in status.reply


async def test_sessions_and_status_in_a_dm_show_topics_and_channels(
    alices_database: Database, tmp_path: Path
) -> None:
    listing, _ = await run_as_alice(alices_database, slack_dm("/sessions"), tmp_path)
    status, _ = await run_as_alice(alices_database, slack_dm("/status"), tmp_path)

    assert DM_SECRET in listing.reply
    assert "Topics are shown only" not in listing.reply
    assert "Channels: slack:D0001, slack:C0001 (thread 1700000001.000100)" in status.reply
