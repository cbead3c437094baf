"""What a file is, judged by its bytes first: the name and the type a platform declared are
only hints, since either may lie (a PDF called `notes.txt`, an executable called `cat.png`).

`sniff` never reads more than the start of the file, except for ZIP containers, whose member
names tell a Word document from a workbook or a presentation.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath


class FileKind(StrEnum):
    """The kinds of file the assistant can read (and the ones it says it cannot)."""

    PDF = "pdf"
    IMAGE = "image"
    DOCX = "docx"
    XLSX = "xlsx"
    PPTX = "pptx"
    CSV = "csv"
    TSV = "tsv"
    HTML = "html"
    MARKDOWN = "markdown"
    JSON = "json"
    EMAIL = "email"
    TEXT = "text"
    ENCRYPTED_OFFICE = "encrypted_office"  # an OLE2 container: legacy or password-protected
    ARCHIVE = "archive"  # a ZIP that is no Office document
    BINARY = "binary"  # anything else


@dataclass(frozen=True, slots=True)
class FileType:
    """A sniffed file: its kind and the media type to describe it with."""

    kind: FileKind
    media_type: str


IMAGE_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
OFFICE_MEMBERS: tuple[tuple[str, FileKind, str], ...] = (
    (
        "word/document.xml",
        FileKind.DOCX,
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ),
    (
        "xl/workbook.xml",
        FileKind.XLSX,
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ),
    (
        "ppt/presentation.xml",
        FileKind.PPTX,
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ),
)
# Text kinds are told apart by the name (or the declared type): their bytes look alike.
TEXT_SUFFIXES: dict[str, tuple[FileKind, str]] = {
    ".csv": (FileKind.CSV, "text/csv"),
    ".tsv": (FileKind.TSV, "text/tab-separated-values"),
    ".tab": (FileKind.TSV, "text/tab-separated-values"),
    ".html": (FileKind.HTML, "text/html"),
    ".htm": (FileKind.HTML, "text/html"),
    ".md": (FileKind.MARKDOWN, "text/markdown"),
    ".markdown": (FileKind.MARKDOWN, "text/markdown"),
    ".json": (FileKind.JSON, "application/json"),
    ".eml": (FileKind.EMAIL, "message/rfc822"),
    ".msg": (FileKind.EMAIL, "message/rfc822"),
}
TEXT_TYPES: dict[str, tuple[FileKind, str]] = {
    "text/csv": TEXT_SUFFIXES[".csv"],
    "text/tab-separated-values": TEXT_SUFFIXES[".tsv"],
    "text/html": TEXT_SUFFIXES[".html"],
    "text/markdown": TEXT_SUFFIXES[".md"],
    "application/json": TEXT_SUFFIXES[".json"],
    "message/rfc822": TEXT_SUFFIXES[".eml"],
}
SNIFF_BYTES = 8192
MAX_ZIP_MEMBERS_LISTED = 10_000


def sniff(data: bytes, name: str = "", declared_type: str = "") -> FileType:
    """The file's kind from its bytes, then its name, then the declared media type."""
    head = data[:SNIFF_BYTES]
    if head.startswith(b"%PDF-") or b"%PDF-" in head[:1024]:
        return FileType(FileKind.PDF, "application/pdf")
    for signature, media_type in IMAGE_SIGNATURES:
        if head.startswith(signature):
            return FileType(FileKind.IMAGE, media_type)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return FileType(FileKind.IMAGE, "image/webp")
    if head.startswith(b"PK\x03\x04"):
        return _zip_kind(data)
    if head.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        return FileType(FileKind.ENCRYPTED_OFFICE, "application/x-ole-storage")
    if not _looks_like_text(head):
        return FileType(FileKind.BINARY, declared_type or "application/octet-stream")
    suffix = PurePosixPath(name.replace("\\", "/")).suffix.lower()
    known = TEXT_SUFFIXES.get(suffix) or TEXT_TYPES.get(declared_type.partition(";")[0].strip())
    if known is not None:
        return FileType(*known)
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if stripped.startswith((b"<!doctype html", b"<html")):
        return FileType(FileKind.HTML, "text/html")
    return FileType(FileKind.TEXT, "text/plain")


def _zip_kind(data: bytes) -> FileType:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set()
            for index, info in enumerate(archive.infolist()):
                if index >= MAX_ZIP_MEMBERS_LISTED:
                    break
                names.add(info.filename)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return FileType(FileKind.BINARY, "application/zip")
    for member, kind, media_type in OFFICE_MEMBERS:
        if member in names:
            return FileType(kind, media_type)
    return FileType(FileKind.ARCHIVE, "application/zip")


def _looks_like_text(head: bytes) -> bool:
    """Text has no NUL bytes and decodes (UTF-8, or UTF-16 with its byte-order mark)."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the sniffing window is still text.
        if exc.start < len(head) - 3:
            return _mostly_printable(head)
    return True


def _mostly_printable(head: bytes) -> bool:
    """Legacy 8-bit text (Latin-1, Windows-1252): few control bytes."""
    controls = sum(1 for byte in head if byte < 32 and byte not in (9, 10, 12, 13))
    return controls <= len(head) // 100


def decode_text(data: bytes) -> str:
    """The bytes as text: UTF-8 or UTF-16 (with a byte-order mark), else Windows-1252."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")
