"""Outbound ``mode: files``: each reply is written as an ``.eml`` file into a folder instead of
being sent, atomically and off the event loop; the config keys that select it."""

from __future__ import annotations

import datetime as dt
import textwrap
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path
from typing import Any

import pytest

from channels.base import ChannelType, OutboundMessage
from channels.email.adapter import EmailChannel, EmailSettings
from channels.email.config import EmailChannelConfig, EmailOutboundConfig
from channels.email.outbound import ReplyFolder
from channels.email.plugin import check_smtp, settings_of
from errors import DeliveryError
from gateway.config import check_config, load_config

ASSISTANT = "assistant@acme.example"
NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)


class NoInbox:
    """Outbound tests receive nothing."""

    async def accept(self, message: Any) -> Any:
        raise AssertionError("no mail is received in these tests")


def files_channel(directory: Path) -> EmailChannel:
    settings = EmailSettings(
        addresses=(ASSISTANT,),
        listen_host="127.0.0.1",
        listen_port=0,
        max_message_bytes=200_000,
        auth_mode="off",
        trusted_authserv_id=None,
        outbound_host="127.0.0.1",
        outbound_port=9,  # discard: nothing may be sent over SMTP in files mode
        outbound_starttls=False,
        outbound_username="",
        outbound_password="",
        outbound_mode="files",
        outbound_directory=directory,
    )
    return EmailChannel(settings, NoInbox(), clock=lambda: NOW)


def reply(message_id: str = "out-1") -> OutboundMessage:
    return OutboundMessage(
        message_id=message_id,
        channel_type=ChannelType.EMAIL,
        channel_id=ASSISTANT,
        content="The budget is €1,200.\n\nSecond paragraph.",
        in_reply_to="m1@example.com",
        reply_context={
            "reply_to": "alice@example.com",
            "reply_to_name": "Alice Example",
            "subject": "Budget",
            "message_id": "m1@example.com",
            "references": ["root@example.com"],
        },
    )


def read_mail(path: Path) -> EmailMessage:
    return BytesParser(policy=policy.default).parsebytes(path.read_bytes())


# --- sending -------------------------------------------------------------------------------


async def test_a_reply_in_files_mode_lands_as_a_readable_eml_file(tmp_path: Path) -> None:
    outbox = tmp_path / "var" / "outbox"  # created on the first reply
    receipt = await files_channel(outbox).send(reply())

    assert receipt.platform_message_id == "reply.out-1@acme.example"
    (path,) = outbox.iterdir()  # no temporary file is left behind
    assert path.name.endswith("-reply.out-1@acme.example.eml")
    mail = read_mail(path)
    assert mail["Return-Path"] == "<assistant@acme.example>"
    assert mail["X-Original-To"] == "alice@example.com"
    assert mail["From"] == ASSISTANT
    assert mail["To"] == "Alice Example <alice@example.com>"
    assert mail["Subject"] == "Re: Budget"
    assert mail["Message-ID"] == "<reply.out-1@acme.example>"
    assert mail["In-Reply-To"] == "<m1@example.com>"
    assert mail["References"] == "<root@example.com> <m1@example.com>"
    assert mail["Auto-Submitted"] == "auto-replied"
    plain = mail.get_body(preferencelist=("plain",))
    assert plain is not None
    assert plain.get_content().startswith("The budget is €1,200.")
    assert b"\r\n" in path.read_bytes()  # the bytes an SMTP relay would get: CRLF lines


async def test_each_reply_gets_its_own_file_in_writing_order(tmp_path: Path) -> None:
    channel = files_channel(tmp_path)
    await channel.send(reply("out-1"))
    await channel.send(reply("out-2"))

    names = sorted(path.name for path in tmp_path.glob("*.eml"))
    assert [name.split("-", 1)[1] for name in names] == [
        "reply.out-1@acme.example.eml",
        "reply.out-2@acme.example.eml",
    ]


async def test_an_unwritable_folder_is_a_retryable_delivery_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the folder should be")

    with pytest.raises(DeliveryError) as caught:
        await files_channel(blocker / "outbox").send(reply())

    assert not caught.value.permanent
    assert str(blocker / "outbox") in str(caught.value)


async def test_a_reply_without_an_address_to_answer_is_still_permanent(tmp_path: Path) -> None:
    message = OutboundMessage(
        message_id="out-9", channel_type=ChannelType.EMAIL, channel_id=ASSISTANT, content="Hi"
    )
    with pytest.raises(DeliveryError) as caught:
        await files_channel(tmp_path).send(message)
    assert caught.value.permanent
    assert list(tmp_path.iterdir()) == []


async def test_the_folder_check_creates_the_folder_and_leaves_it_empty(tmp_path: Path) -> None:
    folder = ReplyFolder(tmp_path / "outbox")
    assert await folder.check() == f"writes replies to {tmp_path / 'outbox'}"
    assert list((tmp_path / "outbox").iterdir()) == []


async def test_the_doctor_check_in_files_mode_probes_the_folder(tmp_path: Path) -> None:
    section = EmailChannelConfig(
        enabled=True,
        outbound=EmailOutboundConfig(mode="files", directory=tmp_path / "outbox", port=1),
    )
    assert await check_smtp(section) == f"writes replies to {tmp_path / 'outbox'}"
    (tmp_path / "file").write_text("")
    blocked = EmailChannelConfig(
        enabled=True, outbound=EmailOutboundConfig(mode="files", directory=tmp_path / "file" / "x")
    )
    with pytest.raises(OSError, match="file"):
        await check_smtp(blocked)


# --- configuration -------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def test_outbound_mode_defaults_to_smtp_so_existing_configs_send_as_before() -> None:
    outbound = EmailOutboundConfig()
    assert outbound.mode == "smtp"
    assert outbound.directory == Path("var/outbox")
    settings = settings_of(EmailChannelConfig())
    assert (settings.outbound_mode, settings.outbound_directory) == ("smtp", Path("var/outbox"))


def test_files_mode_and_its_folder_reach_the_channel_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        channels:
          email: {outbound: {mode: files, directory: /srv/replies}}
        """,
    )
    settings = settings_of(load_config(path, {}).channels.email)
    assert settings.outbound_mode == "files"
    assert settings.outbound_directory == Path("/srv/replies")


@pytest.mark.parametrize(
    ("outbound", "key_path", "message"),
    [
        ("{mode: maildir}", "channels.email.outbound.mode", "'smtp' or 'files'"),
        ('{mode: files, directory: ""}', "channels.email.outbound.directory", "must not be empty"),
        ("{mode: files, dir: var/out}", "channels.email.outbound.dir", "unknown key"),
    ],
)
def test_bad_outbound_keys_are_reported_at_the_key(
    tmp_path: Path, outbound: str, key_path: str, message: str
) -> None:
    path = write(tmp_path, f"channels:\n  email: {{outbound: {outbound}}}\n")
    (problem,) = check_config(path, {})
    assert problem.key_path == key_path
    assert problem.line == 2
    assert message in problem.message
