"""Files people send: how a channel hands the gateway an attachment's bytes.

Bytes a channel holds when it accepts a message (a mail's parts, a web upload) go into the
gateway's `FileStash` before the acknowledgement, and the attachment names them
(`Attachment.source = {"stash": key}`). Bytes a platform keeps (Slack, Teams) are fetched
after the acknowledgement, when the turn runs, by the channel itself (`FileChannel`): only from
the platform's own file hosts, with the bot's credentials, within a size and time limit. A
file that cannot be had raises `AttachmentError`, whose reason the reply shows the user
("I could not open report.pdf: too large (42 MB, limit 25 MB)").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from channels.base import Attachment

STASH_KEY = "stash"

MB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FileLimits:
    """How much a message may bring (`files` in the config)."""

    enabled: bool = True
    max_file_bytes: int = 25 * MB
    max_message_bytes: int = 50 * MB
    max_files: int = 10


class AttachmentError(Exception):
    """An attachment's bytes could not be had; `reason` is said to the user as it is."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FileStash(Protocol):
    """Where a channel keeps the bytes it holds at acceptance until the turn reads them."""

    async def put(self, data: bytes) -> str:
        """Keep `data`; the key to name in `Attachment.source`."""
        ...

    async def discard(self, key: str) -> None:
        """Drop what `put` kept under `key` (the message was not accepted after all)."""
        ...


@runtime_checkable
class FileChannel(Protocol):
    """A channel whose platform keeps the files people send (fetched when the turn runs)."""

    async def fetch_attachment(self, attachment: Attachment, *, max_bytes: int) -> bytes:
        """The attachment's bytes. Raises `AttachmentError` (too large, refused by the
        platform, a host that is not the platform's, a timeout)."""
        ...


def size_text(size: int) -> str:
    """A size as people read it: `42 MB`, `830 KB`, `12 bytes`."""
    if size >= 1024 * 1024:
        return f"{size / (1024 * 1024):.0f} MB"
    if size >= 1024:
        return f"{size / 1024:.0f} KB"
    return f"{size} bytes"


def too_large(size: int, limit: int) -> AttachmentError:
    """The refusal of a file over the limit."""
    return AttachmentError(f"too large ({size_text(size)}, limit {size_text(limit)})")
