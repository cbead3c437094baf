"""The bounds every file is read within, and the outcome of reading one."""

from __future__ import annotations

from dataclasses import dataclass

from sessions.files.kinds import FileKind


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """How much of a file is read: enough to answer about it, never enough to hurt.

    Office files are ZIP archives of XML: their unpacked size and packing ratio are checked
    before any parser sees them (a few kilobytes can unpack to gigabytes).
    """

    max_text_chars: int = 200_000
    max_pages: int = 100
    max_sheets: int = 5
    max_rows: int = 2_000
    max_columns: int = 50
    max_slides: int = 200
    max_unpacked_bytes: int = 200 * 1024 * 1024
    max_pack_ratio: int = 200
    max_json_depth: int = 64
    seconds: float = 20.0


@dataclass(frozen=True, slots=True)
class FittedImage:
    """Image bytes the API accepts, with their media type and size."""

    data: bytes
    media_type: str
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class FileText:
    """What reading a file gave: its text (possibly cut short), or why there is none."""

    kind: FileKind
    media_type: str
    text: str = ""
    truncated: bool = False
    pages: int | None = None
    # Why the file could not be read ("encrypted", "damaged: …", "unsupported file type"):
    # a sentence the reply can carry. Empty when the text is all there is to say.
    problem: str = ""
    # An image, fitted to the API's limits where it was read (the reader's child process).
    image: FittedImage | None = None

    @property
    def readable(self) -> bool:
        """Whether anything was read."""
        return not self.problem


def cut(text: str, limit: int) -> tuple[str, bool]:
    """`text` within `limit` characters, cut at a line end where one is near."""
    if len(text) <= limit:
        return text, False
    head = text[:limit]
    newline = head.rfind("\n", max(0, limit - 2000))
    return (head[:newline] if newline > 0 else head), True
