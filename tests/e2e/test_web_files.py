"""Files through the web API into a whole gateway (offline model, local transcripts): the
bytes wait in the stash from acceptance until the turn has stored them with the session, the
stored message holds the files' text, the page's history shows their names, and the limits of
the `files` section (reloaded too) refuse an upload before anything is kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gateway.reload import apply_config
from storage.models import SessionMessage
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway
from tests.sessions.files.samples import pdf

NOTES = b"Meeting notes\nThe budget is 12,400 EUR.\n"
REPORT = ["Quarterly report", "Revenue grew 12 percent."]


def incoming(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "transcripts" / "incoming"
    return sorted(folder.iterdir()) if folder.exists() else []


async def upload(
    gateway: RunningGateway, text: str, *files: tuple[str, bytes, str], **fields: str
) -> Any:
    return await gateway.client.post(
        "/web/v1/messages",
        data={"user": "alice", "text": text, **fields},
        files=[("files", item) for item in files],
    )


async def stored_user_message(gateway: RunningGateway) -> SessionMessage:
    async with gateway.runtime.database.session() as db:
        rows = list(await db.scalars(select(SessionMessage).where(SessionMessage.role == "user")))
    [row] = rows
    return row


async def test_uploaded_files_wait_in_the_stash_until_the_turn_stores_and_reads_them(
    database_url: str, tmp_path: Path
) -> None:
    report = pdf(REPORT)
    # The model's thinking time keeps the turn open while the stash is looked at.
    config = gateway_config(database_url, tmp_path, llm={"offline_latency": "1500ms"})
    async with running_gateway(config) as gateway:
        response = await upload(
            gateway,
            "What is the budget?",
            ("notes.txt", NOTES, "text/plain"),
            ("report.pdf", report, "application/pdf"),
            message_id="m-1",
        )
        assert response.status_code == 202, response.text
        stashed = sorted(path.read_bytes() for path in incoming(tmp_path))
        assert stashed == sorted([NOTES, report])

        [reply] = await gateway.wait_for_replies("alice", 1)
        await gateway.wait_for_turns_to_end("alice")
        stored = await stored_user_message(gateway)
        history = await gateway.client.get("/web/v1/history", params={"user": "alice"})
        left = incoming(tmp_path)

    assert reply["in_reply_to"] == "m-1"
    assert "What is the budget?" in reply["text"]
    assert stored.message_id == "alice:m-1"
    assert stored.content.startswith("What is the budget?")
    assert '<file name="notes.txt"' in stored.content
    assert "The budget is 12,400 EUR." in stored.content
    assert '<file name="report.pdf"' in stored.content
    assert "Revenue grew 12 percent." in stored.content
    assert [item["name"] for item in stored.metadata_json["files"]] == ["notes.txt", "report.pdf"]
    assert left == []

    user_item, reply_item = history.json()["messages"]
    assert user_item["role"] == "user"
    assert user_item["text"] == "What is the budget?"  # not the files' text stored with it
    assert user_item["attachments"] == ["notes.txt", "report.pdf"]
    assert reply_item["message_id"] == reply["message_id"]


async def test_a_file_alone_is_a_message_the_turn_answers(tmp_path: Path) -> None:
    config = gateway_config(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", tmp_path)
    async with running_gateway(config) as gateway:
        response = await upload(gateway, "", ("notes.txt", NOTES, "text/plain"))
        assert response.status_code == 202, response.text
        [reply] = await gateway.wait_for_replies("alice", 1)
        await gateway.wait_for_turns_to_end("alice")
        stored = await stored_user_message(gateway)
        history = await gateway.client.get("/web/v1/history", params={"user": "alice"})
    assert "notes.txt" in reply["text"]
    assert "The budget is 12,400 EUR." in stored.content
    assert history.json()["messages"][0]["text"] == ""
    assert history.json()["messages"][0]["attachments"] == ["notes.txt"]
    assert incoming(tmp_path) == []


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        (
            [("scan.pdf", b"%PDF-1.4\n" + b"0" * (2 * 1024 * 1024), "application/pdf")],
            "scan.pdf is too large (2 MB, limit 1 MB)",
        ),
        ([(f"n{i}.txt", b"n", "text/plain") for i in range(3)], "at most 2 files"),
    ],
    ids=["too-large", "too-many"],
)
async def test_the_files_section_limits_refuse_an_upload_with_413(
    tmp_path: Path, files: list[tuple[str, bytes, str]], reason: str
) -> None:
    config = gateway_config(
        f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        tmp_path,
        files={"max_file_mb": 1, "max_files_per_message": 2},
    )
    async with running_gateway(config) as gateway:
        response = await upload(gateway, "read these", *files)
        json_still = await gateway.post("alice", "plain text still works")
        await gateway.wait_for_replies("alice", 1)
    assert response.status_code == 413
    assert reason in response.json()["error"]
    assert json_still.status_code == 202
    assert incoming(tmp_path) == []


async def test_reloaded_file_limits_apply_to_the_next_upload(tmp_path: Path) -> None:
    database = f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"
    config = gateway_config(database, tmp_path, files={"max_files_per_message": 1})
    two = (("a.txt", b"a", "text/plain"), ("b.txt", b"b", "text/plain"))
    async with running_gateway(config) as gateway:
        before = await upload(gateway, "two files", *two)
        await apply_config(
            gateway.runtime, gateway_config(database, tmp_path, files={"max_files_per_message": 2})
        )
        after = await upload(gateway, "two files", *two)
        await gateway.wait_for_replies("alice", 1)
    assert before.status_code == 413
    assert after.status_code == 202, after.text
