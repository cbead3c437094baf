"""The files that came with a user's message, made part of the turn.

The gateway hands in each file's bytes, or why it could not have them (`IncomingFile`). Here
each file is stored under the session's prefix in the transcript store (named by its SHA-256,
so the same file sent twice in a session is kept once, and deleting the session deletes it),
read in the file reader's child process, and shown to the model:

- in the turn it arrives with, as content blocks: PDFs and images natively (the model sees
  pages and pictures), everything else as its text fenced as data (`blocks.py`);
- in the stored message, for later turns, compaction, recall and the export, as text: the
  file's extracted text in the same fence (PDFs included), or a line naming an image or a
  file that could not be read. So a file's text counts against the history budget like
  anything said, is summarised with it when the session is compacted, and is found by recall.

A file that could not be had or read becomes a sentence for the reply ("I could not open
report.pdf: too large (42 MB, limit 25 MB).") and a line in the stored message, never silence.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from errors import ArchiveExistsError
from sessions.files.blocks import ContentBlock, fenced_text, file_blocks, quote_name, text_block
from sessions.files.kinds import FileKind
from sessions.files.limits import FileText
from sessions.files.reader import FileReader
from sessions.progress import NO_PROGRESS, TurnProgress
from storage.transcripts import SessionRef, TranscriptStore, session_file_key

log = structlog.stdlib.get_logger(__name__)

IMAGE_TOKENS = 1600  # an image scaled to fit the API's limits costs about this much
PDF_PAGE_TOKENS = 1500  # a PDF page sent natively: its text and its picture


@dataclass(frozen=True, slots=True)
class IncomingFile:
    """A file that came with the message: its bytes, or why the gateway could not have them
    (a sentence: "too large (42 MB, limit 25 MB)")."""

    name: str
    declared_type: str = ""
    data: bytes | None = None
    problem: str = ""


@dataclass(frozen=True, slots=True)
class TurnFiles:
    """The files of one message, as the turn uses them."""

    # Appended to the stored user message: the files' texts (fenced) or what stood instead.
    text: str
    # This turn's blocks that show the files to the model (before the message's own text).
    blocks: tuple[ContentBlock, ...]
    # Lines for this turn's message about files no block shows (not opened, not read).
    notes: str
    # Their cost in this turn beyond the stored text (pages and images sent natively).
    native_tokens: int
    # Stored with the message (`metadata["files"]`): name, type, size, SHA-256, key, pages.
    records: tuple[dict[str, Any], ...]
    # Sentences for the reply about files that could not be opened or read.
    problems: tuple[str, ...]


class FileIntake:
    """Stores, reads and shows the files of a user's message (see the module docstring)."""

    def __init__(self, transcripts: TranscriptStore, reader: FileReader) -> None:
        self.transcripts = transcripts
        self.reader = reader

    async def take(
        self,
        ref: SessionRef,
        files: Sequence[IncomingFile],
        progress: TurnProgress = NO_PROGRESS,
    ) -> TurnFiles:
        """The files made part of the turn; raises `StorageError` when one cannot be stored
        (the turn is retried: a file is never silently left out)."""
        texts: list[str] = []
        notes: list[str] = []
        blocks: list[ContentBlock] = []
        records: list[dict[str, Any]] = []
        problems: list[str] = []
        native_tokens = 0
        for incoming in files:
            if incoming.data is None:
                problems.append(f"I could not open {incoming.name}: {incoming.problem}.")
                texts.append(_note(incoming.name, f"not opened: {incoming.problem}"))
                notes.append(texts[-1])
                records.append({"name": incoming.name, "problem": incoming.problem})
                continue
            progress.status("reading", incoming.name)
            record = await self._store(ref, incoming, incoming.data)
            read = await self.reader.read(incoming.data, incoming.name, incoming.declared_type)
            shown = file_blocks(incoming.name, incoming.data, read)
            record.update(media_type=read.media_type, kind=read.kind.value)
            if read.pages is not None:
                record["pages"] = read.pages
            problem = shown.problem or (read.problem if not shown.blocks else "")
            if problem:
                record["problem"] = problem
                problems.append(f"I could not read {incoming.name}: {problem}.")
            blocks.extend(shown.blocks)
            native_tokens += _native_cost(shown.blocks, read)
            texts.append(_stored_text(incoming.name, read, problem, len(incoming.data)))
            if not shown.blocks:
                notes.append(texts[-1])
            records.append(record)
        return TurnFiles(
            text="\n\n".join(texts),
            blocks=tuple(blocks),
            notes="\n".join(notes),
            native_tokens=native_tokens,
            records=tuple(records),
            problems=tuple(problems),
        )

    async def _store(self, ref: SessionRef, incoming: IncomingFile, data: bytes) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        key = session_file_key(ref, digest)
        if await self.transcripts.stat(key) is None:
            # Stored meanwhile (a retried turn): the same bytes under the same name.
            with contextlib.suppress(ArchiveExistsError):
                await self.transcripts.write_archive(key, data)
        log.info("files.stored", name=incoming.name, size=len(data), sha256=digest)
        return {"name": incoming.name, "size": len(data), "sha256": digest, "key": key}


def message_blocks(files: TurnFiles, text: str) -> tuple[ContentBlock, ...]:
    """The user message of this turn as blocks: the files first, then what the user wrote
    and the notes of files no block shows."""
    own = "\n\n".join(part for part in (text, files.notes) if part)
    return (*files.blocks, text_block(own or "(files only)"))


def _native_cost(blocks: Sequence[ContentBlock], read: FileText) -> int:
    cost = 0
    for block in blocks:
        if block.get("type") == "image":
            cost += IMAGE_TOKENS
        elif block.get("type") == "document":
            cost += PDF_PAGE_TOKENS * max(read.pages or 1, 1)
    return cost


def _stored_text(name: str, read: FileText, problem: str, size: int) -> str:
    if problem:
        return _note(name, f"could not be read: {problem}")
    if read.kind is FileKind.IMAGE:
        return _note(name, f"an image ({read.media_type}, {size} bytes), shown when it was sent")
    return fenced_text(name, read)


def _note(name: str, what: str) -> str:
    return f"[File {quote_name(name)}: {what}]"
