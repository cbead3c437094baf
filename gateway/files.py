"""Files people send, from the channel to the turn.

`TranscriptStash` keeps the bytes a channel holds when it accepts a message (a mail's parts, a
web upload) in the transcript store under `incoming/` until the turn has stored them under its
session; `FileGatherer` collects a message's files for its turn, within the configured limits:
from the stash, or fetched by the channel from its platform (`channels.files.FileChannel`).
A file that cannot be had is handed on with the reason, so the reply can say it.
`sweep_stash` (a background job) deletes stashed bytes no waiting message names.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from channels.base import Attachment, ChannelMessage
from channels.files import (
    STASH_KEY,
    AttachmentError,
    FileChannel,
    FileLimits,
    size_text,
    too_large,
)
from channels.plugin import ChannelAdapter
from errors import StorageError
from gateway.log import get_logger
from sessions.files.turn_files import IncomingFile
from storage.database import Database
from storage.repositories.inbox import InboxRepository
from storage.transcripts import TranscriptStore, incoming_file_key

log = get_logger(__name__)


class TranscriptStash:
    """`channels.files.FileStash` over the transcript store."""

    def __init__(self, transcripts: TranscriptStore) -> None:
        self.transcripts = transcripts

    async def put(self, data: bytes) -> str:
        """Keep `data` under a new key (raises `StorageError`: the message is refused and the
        platform or sender retries)."""
        key = uuid.uuid4().hex
        await self.transcripts.write_archive(incoming_file_key(key), data)
        return key

    async def discard(self, key: str) -> None:
        """Delete the bytes under `key`; a failure is logged (the next sweep removes them)."""
        try:
            await self.transcripts.delete(incoming_file_key(key))
        except StorageError as exc:
            log.warning("files.stash_not_discarded", key=key, error=str(exc))


STASH_MIN_AGE = timedelta(hours=1)  # a stash younger may belong to a message being accepted


async def sweep_stash(database: Database, transcripts: TranscriptStore, now: datetime) -> int:
    """Delete stashed bytes no message waits for any more (their turn committed but the
    process died before discarding them, or the message was never accepted); how many.
    Only objects older than `STASH_MIN_AGE` are candidates, so a file stashed for a message
    whose acceptance has not committed yet is never taken."""
    candidates = await transcripts.list_incoming(now - STASH_MIN_AGE)
    if not candidates:
        return 0
    async with database.session() as db:
        pending = await InboxRepository(db).pending_attachments()
    waited_for = {
        incoming_file_key(str(item["source"][STASH_KEY]))
        for attachments in pending
        for item in attachments
        if isinstance(item, dict) and STASH_KEY in (item.get("source") or {})
    }
    swept = 0
    for key in candidates:
        if key not in waited_for:
            await transcripts.delete(key)
            swept += 1
    if swept:
        log.info("files.stash_swept", objects=swept)
    return swept


class FileGatherer:
    """The files of a message, for its turn."""

    def __init__(self, transcripts: TranscriptStore, limits: FileLimits) -> None:
        self.transcripts = transcripts
        self.limits = limits
        self.stash = TranscriptStash(transcripts)

    async def gather(
        self, message: ChannelMessage, adapter: ChannelAdapter | None
    ) -> tuple[IncomingFile, ...]:
        """Each attachment's bytes, or why there are none. Raises `StorageError` when a
        stashed file cannot be read now (the turn is retried)."""
        limits = self.limits
        gathered: list[IncomingFile] = []
        total = 0
        for index, attachment in enumerate(message.attachments):
            if not limits.enabled:
                problem = "reading files is turned off here"
            elif index >= limits.max_files:
                problem = f"only the first {limits.max_files} files of a message are read"
            elif attachment.size > limits.max_file_bytes:
                problem = too_large(attachment.size, limits.max_file_bytes).reason
            else:
                try:
                    data = await self._bytes_of(attachment, adapter)
                except AttachmentError as exc:
                    problem = exc.reason
                else:
                    if total + len(data) > limits.max_message_bytes:
                        problem = (
                            f"the files of one message may hold "
                            f"{size_text(limits.max_message_bytes)} together"
                        )
                    else:
                        total += len(data)
                        gathered.append(
                            IncomingFile(attachment.filename, attachment.content_type, data)
                        )
                        continue
            log.info(
                "files.not_gathered",
                channel=message.channel_type.value,
                message_id=message.message_id,
                name=attachment.filename,
                problem=problem,
            )
            gathered.append(
                IncomingFile(attachment.filename, attachment.content_type, None, problem)
            )
        return tuple(gathered)

    async def discard(self, message: ChannelMessage) -> None:
        """Drop the stashed bytes of a message whose turn stored them (or that was refused);
        a failure leaves them for the next sweep, logged."""
        for attachment in message.attachments:
            key = attachment.source.get(STASH_KEY)
            if isinstance(key, str):
                await self.stash.discard(key)

    async def _bytes_of(self, attachment: Attachment, adapter: ChannelAdapter | None) -> bytes:
        limit = self.limits.max_file_bytes
        key = attachment.source.get(STASH_KEY)
        if isinstance(key, str):
            data = await self.transcripts.read(incoming_file_key(key))
        elif attachment.source and isinstance(adapter, FileChannel):
            data = await adapter.fetch_attachment(attachment, max_bytes=limit)
        else:
            raise AttachmentError("this channel did not pass the file on")
        if len(data) > limit:
            raise too_large(len(data), limit)
        return data
