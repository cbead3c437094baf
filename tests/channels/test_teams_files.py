"""Files people send in Teams, fetched when the turn runs: shared OneDrive/SharePoint files
from their pre-authenticated URL without the bot's token, inline images from the service URL
with it; from those hosts only, within the size and time limits."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from channels.base import Attachment
from channels.files import AttachmentError, FileChannel
from channels.teams.adapter import TeamsChannel, TeamsSettings
from channels.teams.config import TeamsChannelConfig
from channels.teams.parse import parse_teams_activity
from tests.channels.teams_activities import personal_message
from tests.channels.teams_channel_harness import NOW, RecordingInbox
from tests.fakes.bot_framework import APP_ID, APP_PASSWORD, TEMPAUTH, FakeBotFramework
from tests.fakes.file_server import ServedFile

LIMIT = 64 * 1024
PNG = b"\x89PNG\r\n\x1a\n" + b"pixels " * 300
DOCX = b"PK\x03\x04 quarterly plan " * 200
FILE_DOWNLOAD = "application/vnd.microsoft.teams.file.download.info"

Open = Callable[..., Any]


@pytest.fixture
async def open_channel(fake: FakeBotFramework) -> AsyncIterator[Open]:
    """Open Teams channels against the fake (settings overridden by keyword); closes them."""
    opened: list[TeamsChannel] = []

    def open_(**overrides: Any) -> TeamsChannel:
        settings: dict[str, Any] = {
            "app_id": APP_ID,
            "app_password": APP_PASSWORD,
            "openid_metadata_url": fake.openid_metadata_url,
            "oauth_token_url": fake.token_url,
            "request_timeout": 0.5,
            "file_hosts": ("127.0.0.1",),
            **overrides,
        }
        channel = TeamsChannel(TeamsSettings(**settings), RecordingInbox(), clock=lambda: NOW)
        opened.append(channel)
        return channel

    yield open_
    for channel in opened:
        await channel.stop()


@pytest.fixture
def teams(open_channel: Open) -> TeamsChannel:
    channel: TeamsChannel = open_channel()
    return channel


def received(fake: FakeBotFramework, *attachments: dict[str, Any]) -> tuple[Attachment, ...]:
    """The attachments of a personal chat message that came with these (as parsed)."""
    activity = {**personal_message(fake, "see attached"), "attachments": list(attachments)}
    message = parse_teams_activity(activity, bot_id=APP_ID)
    assert message is not None
    return message.attachments


def shared_file(name: str, download_url: str) -> dict[str, Any]:
    return {
        "contentType": FILE_DOWNLOAD,
        "contentUrl": f"https://contoso.sharepoint.com/personal/alice/Documents/{name}",
        "name": name,
        "content": {"downloadUrl": download_url, "uniqueId": "1150D938", "fileType": "docx"},
    }


def image(content_url: str) -> dict[str, Any]:
    return {"contentType": "image/png", "contentUrl": content_url, "name": "image.png"}


def shared(fake: FakeBotFramework, served: ServedFile) -> Attachment:
    (attachment,) = received(fake, shared_file(served.name, fake.add_shared_file(served)))
    return attachment


def inline(fake: FakeBotFramework, served: ServedFile) -> Attachment:
    (attachment,) = received(fake, image(fake.add_content("0-eus-d1-abc", served)))
    return attachment


async def refusal(channel: TeamsChannel, attachment: Attachment, limit: int = LIMIT) -> str:
    with pytest.raises(AttachmentError) as refused:
        await channel.fetch_attachment(attachment, max_bytes=limit)
    return refused.value.reason


def test_the_teams_channel_is_a_file_channel(teams: TeamsChannel) -> None:
    assert isinstance(teams, FileChannel)


def test_the_parser_says_where_each_file_is_fetched_from(fake: FakeBotFramework) -> None:
    card = {"contentType": "application/vnd.microsoft.card.adaptive", "content": {}}
    download = "https://contoso.sharepoint.com/_layouts/15/download.aspx?tempauth=x"
    found = received(fake, shared_file("plan.docx", download), image("https://smba/1"), card)
    assert [item.source for item in found] == [
        {"teams_download": download},
        {"teams_content": "https://smba/1", "service_url": fake.service_url},
        {},
    ]


async def test_a_shared_file_is_downloaded_without_the_bot_token(
    teams: TeamsChannel, fake: FakeBotFramework
) -> None:
    attachment = shared(fake, ServedFile("plan.docx", DOCX))
    assert await teams.fetch_attachment(attachment, max_bytes=LIMIT) == DOCX
    assert fake.file_requests == [("/sharepoint/plan.docx", None)]
    assert fake.token_requests == []


async def test_an_inline_image_is_downloaded_with_the_bot_token(
    teams: TeamsChannel, fake: FakeBotFramework
) -> None:
    attachment = inline(fake, ServedFile("image.png", PNG, "image/png"))
    assert await teams.fetch_attachment(attachment, max_bytes=LIMIT) == PNG
    [(path, authorization)] = fake.file_requests
    assert path == "/amer/v3/attachments/0-eus-d1-abc/views/original"
    assert authorization == "Bearer connector-token-1"


async def test_an_image_is_fetched_from_the_service_url_host_without_configuration(
    open_channel: Open, fake: FakeBotFramework
) -> None:
    channel = open_channel(file_hosts=())
    attachment = inline(fake, ServedFile("image.png", PNG, "image/png"))
    assert await channel.fetch_attachment(attachment, max_bytes=LIMIT) == PNG
    # The service URL serves images to the bot; shared files come from SharePoint only.
    assert await refusal(channel, shared(fake, ServedFile("a.docx", DOCX))) == (
        "it is not on a Teams file server"
    )


async def test_without_verified_activities_the_service_url_is_not_trusted(
    open_channel: Open, fake: FakeBotFramework
) -> None:
    channel = open_channel(file_hosts=(), insecure_dev_mode=True)
    attachment = inline(fake, ServedFile("image.png", PNG, "image/png"))
    assert await refusal(channel, attachment) == "it is not on a Teams file server"
    assert fake.file_requests == []
    assert fake.token_requests == []


@pytest.mark.parametrize("kind", ["shared", "inline"])
async def test_a_file_on_another_host_is_refused_without_a_request(
    teams: TeamsChannel, fake: FakeBotFramework, kind: str
) -> None:
    elsewhere = f"http://localhost:{fake.port}/sharepoint/plan.docx?tempauth={TEMPAUTH}"
    fake.add_shared_file(ServedFile("plan.docx", DOCX))
    item = shared_file("plan.docx", elsewhere) if kind == "shared" else image(elsewhere)
    (attachment,) = received(fake, item)
    assert await refusal(teams, attachment) == "it is not on a Teams file server"
    assert fake.file_requests == []
    assert fake.token_requests == []  # no token is even fetched for a foreign host


async def test_an_expired_download_url_is_refused(
    teams: TeamsChannel, fake: FakeBotFramework
) -> None:
    url = fake.add_shared_file(ServedFile("plan.docx", DOCX)).replace(TEMPAUTH, "expired")
    (attachment,) = received(fake, shared_file("plan.docx", url))
    assert await refusal(teams, attachment) == "Teams refused the download (401)"


async def test_an_image_with_a_token_the_connector_refuses_is_refused(
    teams: TeamsChannel, fake: FakeBotFramework
) -> None:
    attachment = inline(fake, ServedFile("image.png", PNG, "image/png"))
    await teams.fetch_attachment(attachment, max_bytes=LIMIT)
    fake.revoke_tokens()
    assert await refusal(teams, attachment) == "Teams refused the download (401)"


async def test_an_image_is_refused_when_the_bot_cannot_get_a_token(
    open_channel: Open, fake: FakeBotFramework
) -> None:
    channel = open_channel(app_password="not-the-password")
    attachment = inline(fake, ServedFile("image.png", PNG, "image/png"))
    assert await refusal(channel, attachment) == "the bot could not sign in to Teams to fetch it"
    assert fake.file_requests == []


async def test_an_image_fetched_without_a_token_is_refused(
    open_channel: Open, fake: FakeBotFramework
) -> None:
    channel = open_channel(app_password="", insecure_dev_mode=True)  # development: no token
    attachment = inline(fake, ServedFile("image.png", PNG, "image/png"))
    assert await refusal(channel, attachment) == "Teams refused the download (401)"
    assert fake.file_requests == [("/amer/v3/attachments/0-eus-d1-abc/views/original", None)]


async def test_a_file_whose_download_declares_more_than_the_limit_is_refused(
    teams: TeamsChannel, fake: FakeBotFramework
) -> None:
    attachment = shared(fake, ServedFile("plan.docx", DOCX))
    assert await refusal(teams, attachment, limit=1024) == "too large (4 KB, limit 1 KB)"


async def test_a_streamed_image_is_cut_off_at_the_limit(
    teams: TeamsChannel, fake: FakeBotFramework
) -> None:
    attachment = inline(fake, ServedFile("image.png", PNG, "image/png", chunked=True))
    reason = await refusal(teams, attachment, limit=1024)
    assert reason == "too large (more than the limit of 1 KB)"


async def test_a_redirect_to_another_host_is_refused(
    teams: TeamsChannel, fake: FakeBotFramework
) -> None:
    elsewhere = f"http://localhost:{fake.port}/sharepoint/real.docx?tempauth={TEMPAUTH}"
    fake.add_shared_file(ServedFile("real.docx", DOCX))
    attachment = shared(fake, ServedFile("plan.docx", b"", redirect=elsewhere))
    assert await refusal(teams, attachment) == "it is not on a Teams file server"
    assert [path for path, _ in fake.file_requests] == ["/sharepoint/plan.docx"]


async def test_the_bot_token_does_not_follow_a_redirect_to_another_host(
    open_channel: Open, fake: FakeBotFramework
) -> None:
    channel = open_channel(file_hosts=("127.0.0.1", "localhost"))
    moved = f"http://localhost:{fake.port}/sharepoint/image.png?tempauth={TEMPAUTH}"
    fake.add_shared_file(ServedFile("image.png", PNG, "image/png"))
    attachment = inline(fake, ServedFile("image.png", b"", redirect=moved))
    assert await channel.fetch_attachment(attachment, max_bytes=LIMIT) == PNG
    assert [authorization for _, authorization in fake.file_requests] == [
        "Bearer connector-token-1",
        None,
    ]


async def test_a_file_that_takes_too_long_is_refused(
    teams: TeamsChannel, fake: FakeBotFramework
) -> None:
    attachment = shared(fake, ServedFile("slow.docx", b"", trickle=True))
    assert await refusal(teams, attachment) == "Teams took longer than 0.5 seconds to send it"


async def test_a_card_is_not_a_file_to_fetch(teams: TeamsChannel, fake: FakeBotFramework) -> None:
    (card,) = received(fake, {"contentType": "application/vnd.microsoft.card.hero"})
    reason = await refusal(teams, card)
    assert reason == "Teams does not let bots download this kind of attachment"


async def test_every_refusal_is_logged_without_the_download_url(
    teams: TeamsChannel, fake: FakeBotFramework
) -> None:
    attachment = shared(fake, ServedFile("plan.docx", DOCX, status=403))
    with capture_logs() as logs:
        await refusal(teams, attachment)
    (line,) = [entry for entry in logs if entry["event"] == "teams.file_refused"]
    assert (line["kind"], line["host"]) == ("teams_download", "127.0.0.1")
    assert line["reason"] == "Teams refused the download (403)"
    assert TEMPAUTH not in repr(logs)


def test_file_hosts_are_host_names_not_urls() -> None:
    config = TeamsChannelConfig(file_hosts=("*.Contoso.SharePoint.us.", "127.0.0.1", "::1"))
    assert config.file_hosts == ("*.contoso.sharepoint.us", "127.0.0.1", "::1")
    for wrong in ("https://files.example.com", "files.example.com:8443", "*", "*.com", "a/b"):
        with pytest.raises(ValidationError, match="invalid file host"):
            TeamsChannelConfig(file_hosts=(wrong,))
