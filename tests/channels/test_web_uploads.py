"""Files sent to the web channel as `multipart/form-data`: file names made safe, the form read
within the files limits (413 with the reason over them), the bytes stashed before the message
is accepted, and every refusal leaving nothing behind; over real HTTP against the channel's
routes with an in-memory inbox and stash."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from channels.base import Attachment
from channels.files import MB, FileLimits
from channels.web.parse import parse_web_message
from channels.web.uploads import clean_filename, media_type_of
from errors import ChannelPayloadError
from tests.channels.web_channel_harness import (
    NOW,
    TOKEN,
    MemoryStash,
    ServedWeb,
    serve_web,
)
from tests.sessions.files.samples import pdf

NOTES = b"Meeting notes\nThe budget is 12,400 EUR.\n"
SMALL = FileLimits(max_file_bytes=1 * MB, max_message_bytes=2 * MB, max_files=3)

FileParts = list[tuple[str, tuple[str, bytes, str]]]


def files(*items: tuple[str, bytes, str]) -> FileParts:
    return [("files", item) for item in items]


async def post(web: ServedWeb, data: dict[str, str], parts: FileParts, **kwargs: Any) -> Any:
    return await web.client.post("/web/v1/messages", data=data, files=parts, **kwargs)


@pytest.fixture
async def web() -> AsyncIterator[ServedWeb]:
    async with serve_web(stash=MemoryStash(), limits=SMALL) as served:
        yield served


def refused(response: httpx.Response, status: int, reason: str) -> None:
    assert response.status_code == status, response.text
    assert reason in response.json()["error"], response.json()


# --- names and types ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\alice\\Q3 report.pdf", "Q3 report.pdf"),
        ("in\x00voi\nce\u202e.pdf", "invoice.pdf"),
        ("  notes.txt ", "notes.txt"),
        ("", "file"),
        ("..", "file"),
        ("dir/", "file"),
        ("\x07\x08", "file"),
    ],
)
def test_a_file_name_is_its_last_component_without_control_characters(sent: str, kept: str) -> None:
    assert clean_filename(sent) == kept


def test_a_long_file_name_is_shortened_keeping_its_extension() -> None:
    name = clean_filename("x" * 500 + ".pdf")
    assert len(name) == 200
    assert name.endswith("xx.pdf")


@pytest.mark.parametrize(
    ("declared", "kept"),
    [
        ("application/pdf", "application/pdf"),
        ("Text/Plain; charset=utf-8", "text/plain"),
        (None, "application/octet-stream"),
        ("", "application/octet-stream"),
        ("not a type", "application/octet-stream"),
        ("text/html\r\nX-Evil: 1", "application/octet-stream"),
    ],
)
def test_a_declared_type_is_kept_without_parameters_or_else_octet_stream(
    declared: str | None, kept: str
) -> None:
    assert media_type_of(declared) == kept


def test_text_may_be_empty_only_when_files_come_with_it() -> None:
    def parse(body: dict[str, str], attachments: tuple[Attachment, ...] = ()) -> Any:
        return parse_web_message(
            body, user_id="alice", now=NOW, max_text_chars=100, attachments=attachments
        )

    attachment = Attachment("notes.txt", "text/plain", 12)
    message = parse({"text": ""}, (attachment,))
    assert message.content == ""
    assert message.attachments == (attachment,)
    assert parse({}, (attachment,)).content == ""
    for body in ({"text": "  "}, {}):
        with pytest.raises(ChannelPayloadError, match="'text'"):
            parse(body)


# --- accepted ---------------------------------------------------------------------------------


async def test_a_text_file_and_a_pdf_are_stashed_before_the_message_is_accepted(
    web: ServedWeb,
) -> None:
    report = pdf(["Quarterly report", "Revenue grew 12%."])
    response = await post(
        web,
        {"user": "alice", "text": "Summarise these", "message_id": "m-1", "thread_id": "t-1"},
        files(("notes.txt", NOTES, "text/plain"), ("report.pdf", report, "application/pdf")),
    )
    assert response.status_code == 202, response.text
    assert response.json() == {"message_id": "m-1", "duplicate": False}
    [message] = web.inbox.accepted
    assert message.message_id == "alice:m-1"
    assert message.content == "Summarise these"
    assert message.thread_id == "t-1"
    notes, report_file = message.attachments
    assert (notes.filename, notes.content_type, notes.size) == (
        "notes.txt",
        "text/plain",
        len(NOTES),
    )
    assert (report_file.filename, report_file.content_type) == ("report.pdf", "application/pdf")
    assert report_file.size == len(report)
    assert web.stash is not None
    assert web.stash.kept[notes.source["stash"]] == NOTES
    assert web.stash.kept[report_file.source["stash"]] == report
    assert message.raw == {
        "user": "alice",
        "text": "Summarise these",
        "message_id": "m-1",
        "thread_id": "t-1",
    }


async def test_files_without_text_are_a_message_and_names_are_made_safe(web: ServedWeb) -> None:
    response = await post(
        web, {"user": "alice"}, files(("../../secret\x00/..\\plan.txt", b"plan", "text/plain"))
    )
    assert response.status_code == 202, response.text
    [message] = web.inbox.accepted
    assert message.content == ""
    assert [a.filename for a in message.attachments] == ["plan.txt"]
    assert "Attachments: plan.txt (text/plain, 4 bytes)" in message.prompt_text()


async def test_a_multipart_form_without_files_is_a_text_message(web: ServedWeb) -> None:
    multipart = await web.client.post(
        "/web/v1/messages",
        content=(
            b'--b\r\nContent-Disposition: form-data; name="user"\r\n\r\nalice\r\n'
            b'--b\r\nContent-Disposition: form-data; name="text"\r\n\r\njust text\r\n--b--\r\n'
        ),
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    assert multipart.status_code == 202, multipart.text
    [message] = web.inbox.accepted
    assert message.content == "just text"
    assert message.attachments == ()
    # Only JSON and multipart are read: an urlencoded form is a body that is not JSON.
    urlencoded = await web.client.post("/web/v1/messages", data={"user": "alice", "text": "hi"})
    refused(urlencoded, 400, "not valid JSON")


async def test_an_empty_file_input_is_ignored(web: ServedWeb) -> None:
    response = await post(
        web, {"user": "alice", "text": "hello"}, files(("", b"", "application/octet-stream"))
    )
    assert response.status_code == 202, response.text
    assert web.inbox.accepted[0].attachments == ()
    refused(await post(web, {"user": "alice"}, files(("", b"", "text/plain"))), 400, "'text'")


async def test_a_repeated_message_keeps_only_the_first_copys_files(web: ServedWeb) -> None:
    form = {"user": "alice", "text": "again", "message_id": "m-1"}
    first = await post(web, form, files(("notes.txt", NOTES, "text/plain")))
    second = await post(web, form, files(("notes.txt", NOTES, "text/plain")))
    assert first.json()["duplicate"] is False
    assert second.json() == {"message_id": "m-1", "duplicate": True}
    [message] = web.inbox.accepted
    assert web.stash is not None
    assert list(web.stash.kept) == [message.attachments[0].source["stash"]]


# --- refused -----------------------------------------------------------------------------------


async def test_a_file_over_the_limit_gets_413_naming_it_and_nothing_is_kept(
    web: ServedWeb,
) -> None:
    big = b"%PDF-1.4\n" + b"0" * (int(1.6 * MB))
    response = await post(
        web,
        {"user": "alice", "text": "read this"},
        files(("notes.txt", NOTES, "text/plain"), ("report.pdf", big, "application/pdf")),
    )
    refused(response, 413, "report.pdf is too large (2 MB, limit 1 MB)")
    assert web.inbox.accepted == []
    assert web.stash is not None
    assert web.stash.kept == {}
    assert web.rejections == [(413, "report.pdf is too large (2 MB, limit 1 MB)")]


async def test_too_many_files_get_413(web: ServedWeb) -> None:
    four = files(*[(f"n{i}.txt", b"x", "text/plain") for i in range(4)])
    refused(await post(web, {"user": "alice", "text": "hi"}, four), 413, "at most 3 files")
    three = files(*[(f"n{i}.txt", b"x", "text/plain") for i in range(3)])
    assert (await post(web, {"user": "alice", "text": "hi"}, three)).status_code == 202
    assert len(web.inbox.accepted) == 1


async def test_files_over_the_message_limit_together_get_413(web: ServedWeb) -> None:
    part = b"y" * (int(0.9 * MB))
    three = files(*[(f"part{i}.bin", part, "application/octet-stream") for i in range(3)])
    refused(
        await post(web, {"user": "alice", "text": "hi"}, three),
        413,
        "the files of one message may be 2 MB together",
    )
    assert web.inbox.accepted == []
    assert web.stash is not None
    assert web.stash.kept == {}


async def test_a_body_over_the_limits_is_refused_before_it_is_read(web: ServedWeb) -> None:
    headers = {
        "content-type": "multipart/form-data; boundary=b",
        "content-length": str(3 * MB),
    }
    # Declared too large: refused from the headers (the body that follows is never read).
    response = await web.client.post(
        "/web/v1/messages", content=b"--b--\r\n" + b"z" * (3 * MB - 7), headers=headers
    )
    refused(response, 413, "the files of one message may be 2 MB together")

    async def chunks() -> AsyncIterator[bytes]:
        # No Content-Length: refused once more than the limits allow has arrived.
        yield (
            b'--b\r\nContent-Disposition: form-data; name="files"; filename="a.bin"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n"
        )
        for _ in range(50):
            yield b"z" * 65_536

    response = await web.client.post(
        "/web/v1/messages",
        content=chunks(),
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    refused(response, 413, "the files of one message may be 2 MB together")
    assert web.inbox.accepted == []


async def test_a_file_under_another_field_name_or_a_repeated_field_gets_400(
    web: ServedWeb,
) -> None:
    response = await web.client.post(
        "/web/v1/messages",
        data={"user": "alice", "text": "hi"},
        files=[("file", ("a.txt", b"a", "text/plain"))],
    )
    refused(response, 400, "files go in parts named 'files', not 'file'")
    response = await web.client.post(
        "/web/v1/messages",
        data={"user": "alice", "text": ["one", "two"]},
        files=files(("a.txt", b"a", "text/plain")),
    )
    refused(response, 400, "'text' is given more than once")
    response = await post(
        web, {"user": "alice", "text": "hi", "sender": "x"}, files(("a.txt", b"a", "text/plain"))
    )
    refused(response, 400, "unknown field(s): sender")
    broken = await web.client.post(
        "/web/v1/messages",
        content=b"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--\r\n",
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    refused(broken, 400, "not valid multipart/form-data")
    assert web.inbox.accepted == []
    assert web.stash is not None
    assert web.stash.kept == {}


async def test_without_a_stash_files_are_refused_not_dropped() -> None:
    async with serve_web() as web:
        response = await post(
            web, {"user": "alice", "text": "hi"}, files(("a.txt", b"a", "text/plain"))
        )
        refused(response, 501, "takes no files")
        assert web.inbox.accepted == []
        page = await web.client.get("/web/")
    assert '"enabled": false' in page.text


async def test_with_files_turned_off_files_are_refused() -> None:
    stash = MemoryStash()
    async with serve_web(stash=stash, limits=FileLimits(enabled=False)) as web:
        response = await post(
            web, {"user": "alice", "text": "hi"}, files(("a.txt", b"a", "text/plain"))
        )
        refused(response, 403, "turned off")
    assert stash.kept == {}


async def test_a_stash_that_fails_gets_503_and_what_it_kept_is_dropped() -> None:
    stash = MemoryStash(failing_after=1)
    async with serve_web(stash=stash, limits=SMALL) as web:
        response = await post(
            web,
            {"user": "alice", "text": "hi"},
            files(("a.txt", b"a", "text/plain"), ("b.txt", b"b", "text/plain")),
        )
        refused(response, 503, "the files could not be stored: the store is down")
        assert web.inbox.accepted == []
    assert stash.puts == 1
    assert stash.kept == {}


async def test_with_tokens_an_upload_is_authenticated_before_its_body_is_read() -> None:
    stash = MemoryStash()
    async with serve_web(stash=stash, limits=SMALL, dev_open=False) as web:
        parts = files(("notes.txt", NOTES, "text/plain"))
        refused(await post(web, {"text": "hi"}, parts), 401, "missing bearer token")
        auth = {"authorization": f"Bearer {TOKEN}"}
        refused(
            await post(web, {"user": "bob", "text": "hi"}, parts, headers=auth),
            403,
            "another user",
        )
        assert stash.kept == {}
        accepted = await post(web, {"text": "hi"}, parts, headers=auth)
        assert accepted.status_code == 202, accepted.text
        [message] = web.inbox.accepted
    assert message.user_identifier == "alice"
    assert stash.kept == {message.attachments[0].source["stash"]: NOTES}


async def test_json_messages_are_unchanged_beside_uploads(web: ServedWeb) -> None:
    response = await web.client.post(
        "/web/v1/messages", json={"user": "alice", "text": "plain", "message_id": "m-9"}
    )
    assert response.status_code == 202
    assert response.json() == {"message_id": "m-9", "duplicate": False}
    assert web.inbox.accepted[0].attachments == ()


async def test_the_page_is_told_the_limits(web: ServedWeb) -> None:
    page = (await web.client.get("/web/")).text
    assert "__UPLOADS__" not in page
    assert (
        'const uploads = {"enabled": true, "max_files": 3, "max_file_bytes": 1048576, '
        '"max_message_bytes": 2097152};'
    ) in page


async def test_text_over_max_text_chars_in_a_form_gets_413(web: ServedWeb) -> None:
    parts = files(("a.txt", b"a", "text/plain"))
    refused(
        await post(web, {"user": "alice", "text": "x" * 1001}, parts),
        413,
        "'text' is longer than 1000 characters",
    )
    # Longer than any text of 1000 characters can be: the parser stops reading it.
    refused(
        await post(web, {"user": "alice", "text": "x" * 5000}, parts),
        413,
        "a field is longer than 1000 characters",
    )
    assert web.stash is not None
    assert web.stash.kept == {}
