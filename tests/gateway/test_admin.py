"""Admin operations on real data: export holds all of one user's words and nobody else's;
deletion leaves nothing of them in any table or in the transcript store (PostgreSQL + S3), and
every deletion (admin, retention) is a logged lifecycle transition to `deleted`."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
import zipfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from sqlalchemy import select, text
from structlog.testing import capture_logs

import gateway.jobs
import sessions.lifecycle
from gateway.admin import Administration, NotFoundError
from gateway.cli import main
from sessions.recall import RecallSearch
from storage.models import Base
from storage.recall_index import RecallIndexRepository
from storage.transcripts import parse_transcript
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway
from tests.fakes.slack_api import (
    SIGNING_SECRET,
    TEAM,
    FakeSlackAPI,
    direct_message,
    event_envelope,
    send_event,
)

ALICE_WORDS = "the secret anvil alloy is tungsten"
BOB_WORDS = "bob prefers blue anvils"


@pytest.fixture
def transitions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The lifecycle's `session.transitioned` lines logged during the test."""
    with capture_logs() as entries:
        # A fresh logger: the module's own may have been cached by an earlier logging set-up.
        monkeypatch.setattr(sessions.lifecycle, "log", structlog.get_logger("sessions.lifecycle"))
        yield entries


def deletions(transitions: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(user, from status, reason) of each logged transition to `deleted`, in order."""
    return [
        (line["user_id"], line["from_status"], line["reason"])
        for line in transitions
        if line["event"] == "session.transitioned" and line["to_status"] == "deleted"
    ]


def admin_config(database_url: str, tmp_path: Path, **storage: Any) -> Any:
    return gateway_config(
        database_url,
        tmp_path,
        storage={"database_url": database_url, **storage},
        sessions={"compaction": {"max_messages": 4, "keep_last_messages": 2}},
        identity={
            "users": [
                {"id": "alice", "org": "acme", "name": "Alice", "slack": [f"{TEAM}:U0001"]},
                {"id": "bob", "org": "acme", "name": "Bob"},
            ]
        },
    )


async def converse(gateway: RunningGateway, slack: FakeSlackAPI | None = None) -> None:
    for n in range(3):
        await gateway.post("alice", f"{ALICE_WORDS} ({n})")
        await gateway.wait_for_replies("alice", n + 1, settle=0)
    await gateway.post("bob", BOB_WORDS)
    await gateway.wait_for_replies("bob", 1, settle=0)
    if slack is not None:
        event = direct_message(f"{ALICE_WORDS} on slack", ts="1700000000.000100")
        assert (await send_event(gateway.client, event_envelope(event, "EvA"))).status_code == 200
        deadline = time.monotonic() + 15
        while not slack.posts() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert slack.posts()


async def rows_mentioning(gateway: RunningGateway, needle: str) -> list[str]:
    """Every row of every table whose text contains `needle` (as `table: row`)."""
    found = []
    async with gateway.runtime.database.session() as db:
        for table in Base.metadata.sorted_tables:
            for row in (await db.execute(select(table))).all():
                if needle in json.dumps([str(value) for value in row], ensure_ascii=False):
                    found.append(f"{table.name}: {row}")
    return found


@pytest.mark.postgres
async def test_delete_user_leaves_nothing_of_them_in_the_database_or_on_s3(
    fresh_postgres_url: str, tmp_path: Path, bucket: str, s3_endpoint: str, s3_client: Any
) -> None:
    transcripts = {"backend": "s3", "s3": {"bucket": bucket, "endpoint_url": s3_endpoint}}
    config = admin_config(fresh_postgres_url, tmp_path, transcripts=transcripts)
    async with running_gateway(config) as gateway:
        await converse(gateway)
        admin = Administration(gateway.runtime.database, gateway.runtime.transcripts, gateway.clock)
        before = s3_client.list_objects_v2(Bucket=bucket, Prefix="sessions/acme/alice/")
        assert any("archive/" in o["Key"] for o in before.get("Contents", []))
        assert await rows_mentioning(gateway, "secret anvil alloy")

        recall = RecallSearch(gateway.runtime.database)
        assert await recall.search("alice", "tungsten alloy", 10)
        deletion = await admin.delete_user("alice")

        assert await recall.search("alice", "tungsten alloy", 10) == []
        assert await rows_mentioning(gateway, "secret anvil alloy") == []
        assert await rows_mentioning(gateway, BOB_WORDS)  # bob keeps his
    after = s3_client.list_objects_v2(Bucket=bucket, Prefix="sessions/acme/alice/")
    assert after.get("KeyCount", 0) == 0
    assert deletion.sessions == 1
    assert deletion.transcript_objects >= 3


async def test_export_of_a_user_holds_both_channels_and_nobody_elses_words(
    database_url: str, tmp_path: Path, slack_api: FakeSlackAPI
) -> None:
    config = admin_config(database_url, tmp_path).model_copy(deep=True)
    config = config.model_validate(
        {
            **config.model_dump(mode="python"),
            "channels": {
                "slack": {
                    "enabled": True,
                    "bot_token": "xoxb-test",
                    "signing_secret": SIGNING_SECRET,
                    "api_base_url": slack_api.url,
                }
            },
        }
    )
    async with running_gateway(config) as gateway:
        await converse(gateway, slack_api)
        admin = Administration(gateway.runtime.database, gateway.runtime.transcripts, gateway.clock)
        summary = await admin.export_zip(tmp_path / "alice.zip", user_id="alice")
        listed = await admin.list_sessions(user_id="alice")
        with pytest.raises(NotFoundError):
            await admin.show_session("no-such-session")
    with zipfile.ZipFile(tmp_path / "alice.zip") as archive:
        names = archive.namelist()
        everything = "\n".join(archive.read(name).decode() for name in names)
        (transcript_name,) = [name for name in names if name.endswith("/transcript.jsonl")]
        # The store's segments, joined in order into one file (not rebuilt from the database).
        exported = parse_transcript(archive.read(transcript_name))
    assert summary["sessions"] == 1
    assert "memory_facts.json" in names
    assert any(name.endswith("/session.json") for name in names)
    assert not any("/transcript/" in name for name in names)
    assert [line.role for line in exported[:2]] == ["user", "assistant"]
    assert len(exported) == listed[0]["message_count"]
    assert any("/archive/full_transcript_pre_compact_" in name for name in names)
    assert f"{ALICE_WORDS} on slack" in everything
    assert f"{ALICE_WORDS} (0)" in everything
    assert BOB_WORDS not in everything
    assert {c["channel_type"] for c in listed[0]["channels"]} == {"web", "slack"}


def write_config(tmp_path: Path, database_url: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "storage": {
                    "database_url": database_url,
                    "transcripts": {"local_path": str(tmp_path / "transcripts")},
                },
                "organizations": [{"id": "acme"}],
                "identity": {
                    "users": [{"id": "alice", "org": "acme"}, {"id": "bob", "org": "acme"}]
                },
            }
        )
    )
    return path


async def test_the_sessions_and_users_commands_print_the_contract_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    config = gateway_config(url, tmp_path)
    async with running_gateway(config) as gateway:
        await gateway.post("alice", ALICE_WORDS)
        await gateway.wait_for_replies("alice", 1, settle=0)
        async with gateway.runtime.database.session() as db:
            (session_id,) = (await db.execute(text("SELECT id FROM sessions"))).scalars()
    path = write_config(tmp_path, url)
    capsys.readouterr()  # the gateway's own log lines

    def run(*argv: str) -> Any:
        code = main([*argv, "--config", str(path), "--json"])
        assert code == 0
        return json.loads(capsys.readouterr().out)

    # argparse runs the commands synchronously (they open their own event loop).
    listing = await asyncio.to_thread(run, "sessions", "list", "--since", "7d")
    shown = await asyncio.to_thread(run, "sessions", "show", session_id)
    users = await asyncio.to_thread(run, "users", "list")
    archived = await asyncio.to_thread(run, "sessions", "archive", session_id)
    deleted = await asyncio.to_thread(run, "sessions", "delete", session_id, "--yes")
    after = await asyncio.to_thread(run, "sessions", "list")
    (item,) = listing
    assert {
        "session_id",
        "user_id",
        "status",
        "message_count",
        "compaction_count",
        "created_at",
        "last_active",
        "topic_summary",
        "channels",
    } <= item.keys()
    assert item["channels"] == [{"channel_type": "web", "channel_id": "alice", "thread_id": None}]
    assert [(m["seq"], m["role"]) for m in shown["messages"]] == [(1, "user"), (2, "assistant")]
    assert {"seq", "role", "channel", "thread_id", "content", "created_at"} <= shown["messages"][
        0
    ].keys()
    assert {u["user_id"] for u in users} >= {"alice", "bob"}
    assert archived["status"] == "archived"
    assert deleted["sessions"] == 1
    assert after == []


def test_delete_without_yes_and_without_a_terminal_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}")
    assert main(["sessions", "delete", "--user", "alice", "--config", str(path)]) == 2
    assert "--yes" in capsys.readouterr().err


async def test_retention_deletes_archived_sessions_past_the_limit_and_keeps_the_rest(
    database_url: str, tmp_path: Path
) -> None:
    config = gateway_config(database_url, tmp_path, retention={"delete_after_days": 30})
    async with running_gateway(config) as gateway:
        await gateway.post("alice", ALICE_WORDS)
        await gateway.wait_for_replies("alice", 1, settle=0)
        # Alice's turn lock is held until the work after her reply ends; the idle job skips
        # a locked user, so it must be free before the job runs.
        await gateway.wait_for_turns_to_end("alice")
        gateway.clock.advance(timedelta(days=2))
        await gateway.post("bob", BOB_WORDS)
        await gateway.wait_for_replies("bob", 1, settle=0)
        jobs = gateway.runtime.jobs
        assert await jobs.archive_idle_sessions() == 1  # alice's, idle for two days
        assert await jobs.enforce_retention() == 0  # archived, but not 30 days old
        gateway.clock.advance(timedelta(days=29))
        assert await jobs.enforce_retention() == 1
        remaining = await gateway.runtime.jobs.admin.list_sessions()  # type: ignore[union-attr]
        assert await rows_mentioning(gateway, "secret anvil alloy") == []
    assert [s["user_id"] for s in remaining] == ["bob"]


async def test_the_jobs_merge_the_recall_full_text_index_once_it_has_grown(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Merged after every entry (2,000 by default), so that a few turns are growth enough.
    monkeypatch.setattr(gateway.jobs, "MERGE_AFTER_ENTRIES", 1)
    async with running_gateway(gateway_config(database_url, tmp_path)) as running:
        jobs = running.runtime.jobs
        assert await jobs.merge_recall_index() == 0  # the first pass: nothing written yet
        # Each turn's entries are written in a transaction of their own: a segment each.
        for number in range(1, 4):
            await running.post("alice", f"{ALICE_WORDS} ({number})")
            await running.wait_for_replies("alice", number, settle=0)
        await running.wait_for_turns_to_end("alice")
        steps = await jobs.merge_recall_index()
        again = await jobs.merge_recall_index()  # nothing written since
        async with running.runtime.database.session() as db:
            left = await RecallIndexRepository(db).merge_step()
    assert steps >= 1 if running.runtime.database.is_sqlite else steps == 0
    assert again == 0
    assert not left


async def test_the_admin_api_needs_its_token_and_serves_sessions_users_exports(
    database_url: str, tmp_path: Path
) -> None:
    config = gateway_config(database_url, tmp_path, admin={"token": "s3cret-admin-token"})
    auth = {"Authorization": "Bearer s3cret-admin-token"}
    async with running_gateway(config) as gateway:
        await gateway.post("alice", ALICE_WORDS)
        await gateway.wait_for_replies("alice", 1, settle=0)
        client = gateway.client
        anonymous = await client.get("/admin/v1/sessions")
        wrong = await client.get("/admin/v1/sessions", headers={"Authorization": "Bearer nope"})
        (listed,) = (await client.get("/admin/v1/sessions?user=alice", headers=auth)).json()
        session_url = f"/admin/v1/sessions/{listed['session_id']}"
        shown = (await client.get(session_url, headers=auth)).json()
        exported = await client.get(f"{session_url}/export", headers=auth)
        users = (await client.get("/admin/v1/users", headers=auth)).json()
        missing = await client.get("/admin/v1/sessions/nope", headers=auth)
        bad_since = await client.get("/admin/v1/sessions?since=soon", headers=auth)
        deleted = await client.delete(session_url, headers=auth)
        after = (await client.get("/admin/v1/sessions", headers=auth)).json()
    assert (anonymous.status_code, wrong.status_code) == (401, 401)
    assert shown["messages"][0]["content"] == ALICE_WORDS
    assert exported.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(exported.content)) as archive:
        assert f"sessions/{listed['session_id']}/session.json" in archive.namelist()
    assert {user["user_id"] for user in users} >= {"alice", "bob"}
    assert missing.status_code == 404
    assert bad_since.status_code == 400
    assert deleted.json()["sessions"] == 1
    assert after == []


async def test_the_admin_api_is_off_without_a_token(tmp_path: Path) -> None:
    config = gateway_config(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", tmp_path)
    async with running_gateway(config) as gateway:
        answer = await gateway.client.get("/admin/v1/sessions", headers={"Authorization": "x"})
    assert answer.status_code == 404


async def test_admin_deletions_of_a_session_and_of_a_user_are_logged_transitions_to_deleted(
    database_url: str, tmp_path: Path, transitions: list[dict[str, Any]]
) -> None:
    config = gateway_config(database_url, tmp_path, admin={"token": "s3cret-admin-token"})
    async with running_gateway(config) as gateway:
        for user, words in (("alice", ALICE_WORDS), ("bob", BOB_WORDS)):
            await gateway.post(user, words)
            await gateway.wait_for_replies(user, 1, settle=0)
        admin = Administration(gateway.runtime.database, gateway.runtime.transcripts, gateway.clock)
        (alices,) = await admin.list_sessions(user_id="alice")
        auth = {"Authorization": "Bearer s3cret-admin-token"}
        answer = await gateway.client.delete(
            f"/admin/v1/sessions/{alices['session_id']}", headers=auth
        )
        after_session = deletions(transitions)
        deletion = await admin.delete_user("bob")
        remaining = await admin.list_sessions()
    assert answer.json() == {"sessions": 1, "transcript_objects": 1, "inbound_events": 0}
    assert after_session == [("alice", "active", "admin")]
    assert deletions(transitions) == [("alice", "active", "admin"), ("bob", "active", "admin")]
    assert deletion.sessions == 1
    assert remaining == []


async def test_retention_deletes_through_the_lifecycle_naming_itself(
    tmp_path: Path, transitions: list[dict[str, Any]]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    config = gateway_config(url, tmp_path, retention={"delete_after_days": 30})
    async with running_gateway(config) as gateway:
        await gateway.post("alice", ALICE_WORDS)
        await gateway.wait_for_replies("alice", 1, settle=0)
        await gateway.wait_for_turns_to_end("alice")
        gateway.clock.advance(timedelta(days=2))
        assert await gateway.runtime.jobs.archive_idle_sessions() == 1
        gateway.clock.advance(timedelta(days=31))
        assert await gateway.runtime.jobs.enforce_retention() == 1
    assert deletions(transitions) == [("alice", "archived", "retention")]


async def test_the_export_zip_is_compressed_off_the_event_loop_and_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    async with running_gateway(admin_config(url, tmp_path)) as gateway:
        await converse(gateway)
        admin = Administration(gateway.runtime.database, gateway.runtime.transcripts, gateway.clock)
        shown = await admin.show_session(
            (await admin.list_sessions(user_id="alice"))[0]["session_id"]
        )
        writers: set[int] = set()
        writestr = zipfile.ZipFile.writestr

        def recorded(archive: zipfile.ZipFile, name: Any, data: Any, *args: Any, **kw: Any) -> None:
            writers.add(threading.get_ident())
            writestr(archive, name, data, *args, **kw)

        monkeypatch.setattr(zipfile.ZipFile, "writestr", recorded)
        summary = await admin.export_zip(tmp_path / "out" / "alice.zip", user_id="alice")
    assert writers
    assert threading.get_ident() not in writers
    with zipfile.ZipFile(tmp_path / "out" / "alice.zip") as archive:
        names = archive.namelist()
        folder = f"sessions/{shown['session_id']}/"
        session = json.loads(archive.read(folder + "session.json"))
        transcript = parse_transcript(archive.read(folder + "transcript.jsonl"))
        archive_names = [name for name in names if "/archive/" in name]
        facts = json.loads(archive.read("memory_facts.json"))
    assert summary == {"sessions": 1, "files": len(names)}
    assert names[0] == folder + "session.json"
    assert names[-2:] == [folder + "transcript.jsonl", "memory_facts.json"]
    assert session["messages"] == json.loads(json.dumps(shown["messages"], default=str))
    assert [line.content for line in transcript] == [m["content"] for m in shown["messages"]]
    assert archive_names
    assert isinstance(facts, list)
