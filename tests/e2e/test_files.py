"""Files end to end: a mail forwarded over SMTP with an invoice inside, into a whole gateway
with the real `anthropic` SDK against the fake Messages API; what the model is sent, what the
session keeps, what the export holds and what a delete leaves (nothing)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import zipfile
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from gateway.settings import GatewayConfig
from storage.models import SessionMessage
from tests.channels.email_mail import deliver
from tests.channels.teams_activities import personal_message
from tests.e2e.harness import running_gateway
from tests.e2e.test_email import ASSISTANT, email_config
from tests.e2e.test_slack import slack_config
from tests.e2e.test_teams import teams_config
from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.fakes.bot_framework import FakeBotFramework
from tests.fakes.file_server import ServedFile
from tests.fakes.slack_api import (
    FakeSlackAPI,
    direct_message,
    event_envelope,
    send_event,
)
from tests.fakes.smtp_sink import SmtpSink
from tests.sessions.files.samples import docx, image, pdf, xlsx

DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
INVOICE = ["Invoice 2026-114 from Northwind", "Total due: 4,812.50 EUR by 15 December"]


def with_fake_model(config: GatewayConfig, api: FakeAnthropicAPI, **files: Any) -> GatewayConfig:
    """`config` answered by the real SDK against the fake Messages API, recall off, and these
    `files` limits."""
    data = config.model_dump()
    data.update(
        llm={"provider": "anthropic", "api_key": "test-key", "base_url": api.url},
        recall={"enabled": False},
        files=files,
    )
    return GatewayConfig.model_validate(data)


def files_config(
    tmp_path: Path, sink: SmtpSink, api: FakeAnthropicAPI, **files: Any
) -> tuple[GatewayConfig, int]:
    config, port = email_config(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", tmp_path, sink)
    return with_fake_model(config, api, **files), port


def forward_with_invoice(invoice: bytes, *, extra: tuple[str, bytes] | None = None) -> bytes:
    """Alice forwards Bob's mail, which carries the invoice, as an attached message."""
    original = EmailMessage()
    original["From"] = "Bob Builder <bob@northwind.example>"
    original["To"] = "alice@example.com"
    original["Subject"] = "Invoice 2026-114"
    original.set_content("Hi Alice, the invoice is attached.")
    original.add_attachment(
        invoice, maintype="application", subtype="pdf", filename="invoice-2026-114.pdf"
    )
    forward = EmailMessage()
    forward["From"] = "Alice Example <alice@example.com>"
    forward["To"] = ASSISTANT
    forward["Subject"] = "Fwd: Invoice 2026-114"
    forward["Message-ID"] = "<fwd-invoice@example.com>"
    forward.set_content("What is the total, and when is it due?")
    forward.add_attachment(original)
    if extra is not None:
        name, data = extra
        forward.add_attachment(data, maintype="application", subtype="octet-stream", filename=name)
    return forward.as_bytes()


def last_user_blocks(api: FakeAnthropicAPI) -> list[dict[str, Any]]:
    (request,) = api.replies
    content = request["messages"][-1]["content"]
    assert isinstance(content, list)
    return content


async def test_a_forwarded_invoice_reaches_the_model_is_exported_and_deleted_with_the_session(
    tmp_path: Path, sink: SmtpSink, fake_api: FakeAnthropicAPI
) -> None:
    invoice = pdf(INVOICE)
    notes = docx(["Payment terms: 30 days net."])
    config, port = files_config(tmp_path, sink, fake_api)
    transcripts = tmp_path / "transcripts"
    async with running_gateway(config) as gateway:
        await deliver(
            port, forward_with_invoice(invoice, extra=("terms.docx", notes)), to=ASSISTANT
        )
        (reply,) = await sink.wait_for(1, timeout=20)
        await gateway.wait_for_turns_to_end("alice")
        (row,) = await gateway.runtime.admin.list_sessions(user_id="alice")
        session_id = row["session_id"]
        shown = await gateway.runtime.admin.show_session(session_id)
        await gateway.runtime.admin.export_zip(tmp_path / "export.zip", session_id=session_id)
        stored_before = sorted(p.name for p in transcripts.rglob("*") if p.is_file())
        await gateway.runtime.admin.delete_session(session_id)
        async with gateway.runtime.database.session() as db:
            left = await db.scalar(select(func.count()).select_from(SessionMessage))

    blocks = last_user_blocks(fake_api)
    documents = [b for b in blocks if b["type"] == "document"]
    assert [base64.b64decode(d["source"]["data"]) for d in documents] == [invoice]
    assert documents[0]["title"] == "invoice-2026-114.pdf"
    texts = "\n".join(b["text"] for b in blocks if b["type"] == "text")
    assert "What is the total" in texts
    assert "Payment terms: 30 days net." in texts  # the Word file, as its text
    assert '<file name="terms.docx"' in texts  # fenced as data
    assert "forwarded-message.eml" in texts  # the attached mail, read as a mail

    user_message = shown["messages"][0]
    assert "Total due: 4,812.50 EUR" in user_message["content"]  # kept as text for later turns
    assert reply.message.get_body(("plain",)) is not None

    digest = hashlib.sha256(invoice).hexdigest()
    assert digest in stored_before
    assert not any(name for name in stored_before if len(name) == 32)  # no stash left over
    with zipfile.ZipFile(tmp_path / "export.zip") as archive:
        names = archive.namelist()
        (session_json,) = [n for n in names if n.endswith("session.json")]
        exported = json.loads(archive.read(session_json))
        (invoice_name,) = [n for n in names if n.endswith(f"files/{digest}")]
        assert archive.read(invoice_name) == invoice
    exported_files = exported["messages"][0]["files"]
    assert {f["name"]: f["sha256"] for f in exported_files}["invoice-2026-114.pdf"] == digest

    assert left == 0
    assert [p for p in transcripts.rglob("*") if p.is_file()] == []


async def test_a_file_over_the_limit_is_named_in_the_reply_and_the_rest_is_read(
    tmp_path: Path, sink: SmtpSink, fake_api: FakeAnthropicAPI
) -> None:
    big = b"%PDF-1.4\n" + b"0" * (2 * 1024 * 1024)
    config, port = files_config(tmp_path, sink, fake_api, max_file_mb=1)
    async with running_gateway(config) as gateway:
        await deliver(
            port, forward_with_invoice(pdf(INVOICE), extra=("scan.pdf", big)), to=ASSISTANT
        )
        (reply,) = await sink.wait_for(1, timeout=20)
        await gateway.wait_for_turns_to_end("alice")
    text = reply.message.get_body(("plain",)).get_content()
    assert "I could not open scan.pdf: too large (2 MB, limit 1 MB)." in text
    blocks = last_user_blocks(fake_api)
    assert any(b["type"] == "document" for b in blocks)  # the invoice still went
    notes = "\n".join(b["text"] for b in blocks if b["type"] == "text")
    assert 'File "scan.pdf": not opened: too large' in notes


async def test_a_slack_dm_with_a_word_file_and_a_screenshot_shows_both_to_the_model(
    tmp_path: Path, fake_api: FakeAnthropicAPI, slack_api: FakeSlackAPI
) -> None:
    report = docx(["Quarterly report", "Revenue grew 12 % over the quarter."])
    screenshot = image(1200, 800)
    files = [
        slack_api.add_file("F0001", ServedFile("report.docx", report, DOCX_TYPE)),
        slack_api.add_file("F0002", ServedFile("screenshot.png", screenshot, "image/png")),
    ]
    event = direct_message("Does the chart match the report?", ts="1800000000.000100", files=files)
    config = with_fake_model(
        slack_config(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", tmp_path, slack_api), fake_api
    )
    async with running_gateway(config) as gateway:
        answer = await send_event(gateway.client, event_envelope(event, "EvFiles"))
        assert answer.status_code == 200
        deadline = asyncio.get_running_loop().time() + 20
        while not fake_api.replies:
            assert asyncio.get_running_loop().time() < deadline, "no request reached the model"
            await asyncio.sleep(0.05)
        await gateway.wait_for_turns_to_end("alice")
    blocks = last_user_blocks(fake_api)
    kinds = [block["type"] for block in blocks]
    assert "image" in kinds
    texts = "\n".join(b["text"] for b in blocks if b["type"] == "text")
    assert "Revenue grew 12 % over the quarter." in texts
    assert "Does the chart match the report?" in texts
    (png,) = [b for b in blocks if b["type"] == "image"]
    assert base64.b64decode(png["source"]["data"]) == screenshot  # small enough as it is


async def test_a_teams_personal_chat_with_a_workbook_shows_its_rows_to_the_model(
    tmp_path: Path, fake_api: FakeAnthropicAPI
) -> None:
    workbook = xlsx({"Orders": [["Order", "Amount"], ["A-17", 120], ["A-18", 345]]})
    async with FakeBotFramework() as teams:
        download = teams.add_shared_file(ServedFile("orders.xlsx", workbook, XLSX_TYPE))
        activity = {
            **personal_message(teams, "Which order is the largest?"),
            "attachments": [
                {
                    "contentType": "application/vnd.microsoft.teams.file.download.info",
                    "contentUrl": "https://contoso.sharepoint.com/personal/alice/orders.xlsx",
                    "name": "orders.xlsx",
                    "content": {"downloadUrl": download, "fileType": "xlsx"},
                }
            ],
        }
        config = teams_config(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", tmp_path, teams)
        data = config.model_dump()
        data["channels"]["teams"]["file_hosts"] = ["127.0.0.1"]  # the fake's "SharePoint"
        config = with_fake_model(GatewayConfig.model_validate(data), fake_api)
        async with running_gateway(config) as gateway:
            answer = await gateway.client.post(
                "/api/messages", json=activity, headers=teams.bearer()
            )
            assert answer.status_code == 200
            deadline = asyncio.get_running_loop().time() + 20
            while not teams.posted:
                assert asyncio.get_running_loop().time() < deadline, "no reply in Teams"
                await asyncio.sleep(0.05)
            await gateway.wait_for_turns_to_end("alice")
    texts = "\n".join(b["text"] for b in last_user_blocks(fake_api) if b["type"] == "text")
    assert '<file name="orders.xlsx"' in texts
    assert "A-18\t345" in texts  # the sheet's rows, as a table
