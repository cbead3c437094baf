"""Files people send on Slack, fetched when the turn runs: from Slack's own hosts only, with
the bot token, within the size and time limits, every failure an `AttachmentError`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from channels.base import Attachment, ChannelMessage
from channels.files import AttachmentError, FileChannel
from channels.slack.adapter import SlackChannel, SlackSettings
from channels.slack.parse import parse_slack_event
from tests.channels.slack_doubles import NoThreads, RecordingInbox
from tests.fakes.file_server import ServedFile
from tests.fakes.slack_api import (
    BOT_TOKEN,
    SIGNING_SECRET,
    FakeSlackAPI,
    direct_message,
    event_envelope,
)

LIMIT = 64 * 1024
PDF = b"%PDF-1.7 quarterly numbers " * 100


@pytest.fixture
async def slack(slack_api: FakeSlackAPI) -> AsyncIterator[SlackChannel]:
    channel = SlackChannel(
        SlackSettings(
            bot_token=BOT_TOKEN,
            signing_secret=SIGNING_SECRET,
            api_base_url=slack_api.url,
            file_timeout=0.5,
        ),
        RecordingInbox(),
        NoThreads(),
    )
    yield channel
    await channel.stop()


def sent(*files: dict[str, Any], **fields: Any) -> ChannelMessage:
    """The message of a DM that came with these files (as the parser makes it)."""
    event = direct_message("see attached", ts="1800000000.000100", files=list(files), **fields)
    message = parse_slack_event(event_envelope(event, "EvFiles"))
    assert message is not None
    return message


def hosted(api: FakeSlackAPI, file_id: str, served: ServedFile, **fields: Any) -> Attachment:
    (attachment,) = sent(api.add_file(file_id, served, **fields)).attachments
    return attachment


async def refusal(channel: SlackChannel, attachment: Attachment, limit: int = LIMIT) -> str:
    with pytest.raises(AttachmentError) as refused:
        await channel.fetch_attachment(attachment, max_bytes=limit)
    return refused.value.reason


def test_the_slack_channel_is_a_file_channel(slack: SlackChannel) -> None:
    assert isinstance(slack, FileChannel)


def test_the_parser_says_where_each_file_is_fetched_from() -> None:
    own = {"id": "F1", "name": "a.pdf", "url_private": "https://files.slack.com/a"}
    drive = {"id": "F2", "name": "b", "is_external": True, "external_type": "gdrive"}
    connect = {"id": "F3", "file_access": "check_file_info"}
    shared = {"is_share": True, "text": "look", "files": [own, {"id": "F4", "name": "c"}]}
    message = sent(own, drive, connect, attachments=[shared])
    assert [item.source for item in message.attachments] == [
        {"slack_file": "F1", "external": False, "download": "https://files.slack.com/a"},
        {"slack_file": "F2", "external": True},
        {"slack_file": "F3", "external": False, "lookup": True},
        {"slack_file": "F4", "external": False},
    ]


def test_a_shared_message_with_odd_files_is_still_answered() -> None:
    message = sent(attachments=[{"is_share": True, "text": "look", "files": "?"}])
    assert message.attachments == ()
    assert message.forwarded is not None


async def test_a_file_is_downloaded_with_the_bot_token(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    attachment = hosted(slack_api, "F0001", ServedFile("q3.pdf", PDF, "application/pdf"))
    assert await slack.fetch_attachment(attachment, max_bytes=LIMIT) == PDF
    assert slack_api.file_requests == [("/files/F0001/q3.pdf", f"Bearer {BOT_TOKEN}")]


async def test_the_files_of_a_shared_message_are_fetched_too(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    file = slack_api.add_file("F0002", ServedFile("notes.txt", b"minutes", "text/plain"))
    message = sent(attachments=[{"is_share": True, "text": "see", "files": [file]}])
    (attachment,) = message.attachments
    assert await slack.fetch_attachment(attachment, max_bytes=LIMIT) == b"minutes"


@pytest.mark.parametrize("host", ["localhost", "files.slack.com.evil.example", "evil.example"])
async def test_a_file_on_another_host_is_refused_without_a_request(
    slack: SlackChannel, slack_api: FakeSlackAPI, host: str
) -> None:
    slack_api.add_file("F0003", ServedFile("x.bin", b"secret"))
    url = f"http://{host}:{slack_api.port}/files/F0003/x.bin"
    attachment = Attachment("x.bin", "application/octet-stream", 6, url, {"download": url})
    assert await refusal(slack, attachment) == "it is not on a Slack file server"
    assert slack_api.file_requests == []


async def test_a_file_offered_over_plain_http_off_loopback_is_refused(
    slack_api: FakeSlackAPI,
) -> None:
    channel = SlackChannel(
        SlackSettings(bot_token=BOT_TOKEN, signing_secret=SIGNING_SECRET),
        RecordingInbox(),
        NoThreads(),
    )
    url = "http://files.slack.com/files-pri/T1-F1/x.bin"
    attachment = Attachment("x.bin", "application/octet-stream", 6, url, {"download": url})
    try:
        assert "unencrypted" in await refusal(channel, attachment)
    finally:
        await channel.stop()


async def test_a_file_declared_larger_than_the_limit_is_refused_before_downloading(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    attachment = hosted(slack_api, "F0004", ServedFile("big.pdf", PDF))
    assert await refusal(slack, attachment, limit=1024) == "too large (3 KB, limit 1 KB)"
    assert slack_api.file_requests == []


async def test_a_file_whose_download_declares_more_than_the_limit_is_refused(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    attachment = hosted(slack_api, "F0005", ServedFile("big.pdf", PDF), size=0)
    assert await refusal(slack, attachment, limit=1024) == "too large (3 KB, limit 1 KB)"


async def test_a_streamed_file_is_cut_off_at_the_limit(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    attachment = hosted(slack_api, "F0006", ServedFile("big.pdf", PDF, chunked=True), size=0)
    reason = await refusal(slack, attachment, limit=1024)
    assert reason == "too large (more than the limit of 1 KB)"


async def test_a_token_slack_does_not_accept_is_refused(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    slack_api.bot_token = "xoxb-rotated"  # Slack answers any other token with its sign-in page
    attachment = hosted(slack_api, "F0007", ServedFile("q3.pdf", PDF, "application/pdf"))
    reason = await refusal(slack, attachment)
    assert reason == "Slack sent its sign-in page instead: it refused the bot access"


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (403, "Slack refused the download (403)"),
        (404, "Slack refused the download (404)"),
        (503, "Slack could not send the file (503)"),
    ],
)
async def test_http_errors_become_a_short_reason(
    slack: SlackChannel, slack_api: FakeSlackAPI, status: int, reason: str
) -> None:
    attachment = hosted(slack_api, f"F{status}", ServedFile("q3.pdf", PDF, status=status))
    assert await refusal(slack, attachment) == reason


@pytest.mark.parametrize(
    "fields", [{"is_external": True, "external_type": "gdrive"}, {"external_type": "dropbox"}]
)
async def test_a_file_kept_outside_slack_is_refused(
    slack: SlackChannel, slack_api: FakeSlackAPI, fields: dict[str, Any]
) -> None:
    attachment = hosted(slack_api, "F0008", ServedFile("plan.gdoc", b"x"), **fields)
    assert await refusal(slack, attachment) == "it is stored outside Slack, where I cannot open it"
    assert slack_api.file_requests == []


async def test_a_slack_connect_file_is_looked_up_then_downloaded(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    slack_api.add_file("F0009", ServedFile("shared.pdf", PDF, "application/pdf"))
    (attachment,) = sent({"id": "F0009", "file_access": "check_file_info"}).attachments
    assert await slack.fetch_attachment(attachment, max_bytes=LIMIT) == PDF
    assert [call.params["file"] for call in slack_api.calls_to("files.info")] == ["F0009"]


async def test_a_slack_connect_file_slack_will_not_share_is_refused(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    (attachment,) = sent({"id": "F0404", "file_access": "check_file_info"}).attachments
    assert await refusal(slack, attachment) == "Slack refused to share it (file_not_found)"
    assert slack_api.file_requests == []


async def test_a_looked_up_file_over_the_limit_is_refused_before_downloading(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    slack_api.add_file("F0010", ServedFile("big.pdf", PDF))
    (attachment,) = sent({"id": "F0010", "file_access": "check_file_info"}).attachments
    assert await refusal(slack, attachment, limit=1024) == "too large (3 KB, limit 1 KB)"
    assert slack_api.file_requests == []


async def test_a_redirect_to_another_host_is_refused(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    elsewhere = f"http://localhost:{slack_api.port}/files/F0011/x.bin"
    slack_api.add_file("F0011", ServedFile("x.bin", b"secret"))
    attachment = hosted(slack_api, "F0012", ServedFile("q3.pdf", b"", redirect=elsewhere))
    assert await refusal(slack, attachment) == "it is not on a Slack file server"
    assert [path for path, _ in slack_api.file_requests] == ["/files/F0012/q3.pdf"]


async def test_a_redirect_within_slack_is_followed_with_the_token(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    slack_api.add_file("F0013", ServedFile("q3.pdf", PDF, "application/pdf"))
    moved = ServedFile("q3.pdf", b"", redirect=f"{slack_api.root}/files/F0013/q3.pdf")
    attachment = hosted(slack_api, "F0014", moved, mimetype="application/pdf")
    assert await slack.fetch_attachment(attachment, max_bytes=LIMIT) == PDF
    assert [auth for _, auth in slack_api.file_requests] == [f"Bearer {BOT_TOKEN}"] * 2


async def test_a_file_that_takes_too_long_is_refused(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    attachment = hosted(slack_api, "F0015", ServedFile("slow.pdf", b"", trickle=True), size=0)
    assert await refusal(slack, attachment) == "Slack took longer than 0.5 seconds to send it"


async def test_every_refusal_is_logged_with_its_reason(
    slack: SlackChannel, slack_api: FakeSlackAPI
) -> None:
    attachment = hosted(slack_api, "F0016", ServedFile("q3.pdf", PDF, status=403))
    with capture_logs() as logs:
        await refusal(slack, attachment)
    (line,) = [entry for entry in logs if entry["event"] == "slack.file_refused"]
    assert line["file"] == "F0016"
    assert line["reason"] == "Slack refused the download (403)"
    assert BOT_TOKEN not in repr(logs)
