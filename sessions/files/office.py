"""Text of Office Open XML files: Word (python-docx), Excel (openpyxl, read-only) and
PowerPoint (python-pptx), all MIT-licensed. Each is a ZIP of XML, checked before parsing for
what a hostile one could do: unpack to gigabytes, or hold thousands of members. XML entity
tricks are defused (openpyxl uses defusedxml when it is installed; python-docx and
python-pptx parse with entities unresolved)."""

from __future__ import annotations

import io
import zipfile
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from docx import Document
from docx.opc.exceptions import PackageNotFoundError as DocxPackageError
from docx.table import Table
from docx.text.paragraph import Paragraph
from lxml.etree import LxmlError  # type: ignore[import-untyped]
from openpyxl import load_workbook
from pptx import Presentation
from pptx.exc import PackageNotFoundError as PptxPackageError

from sessions.files.kinds import FileKind
from sessions.files.limits import FileText, ReadLimits, cut

MAX_MEMBERS = 5_000
PARSE_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    DocxPackageError,
    PptxPackageError,
    LxmlError,
    KeyError,
    ValueError,
    TypeError,
    AttributeError,
    IndexError,
    EOFError,
    OSError,
)


class UnsafeArchiveError(Exception):
    """The ZIP would unpack to more than the limits allow."""


def check_archive(data: bytes, limits: ReadLimits) -> None:
    """Refuse a ZIP whose declared unpacked size, packing ratio or member count is too big.

    The declared sizes are what the parsers trust when they allocate, so checking them here
    is enough: a member that lies about its size fails its CRC check when read."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = archive.infolist()
    if len(members) > MAX_MEMBERS:
        raise UnsafeArchiveError(f"it holds {len(members)} parts")
    unpacked = sum(member.file_size for member in members)
    if unpacked > limits.max_unpacked_bytes:
        raise UnsafeArchiveError(f"it unpacks to {unpacked // (1024 * 1024)} MB")
    for member in members:
        if member.file_size > 1024 * 1024 and member.file_size > limits.max_pack_ratio * max(
            member.compress_size, 1
        ):
            raise UnsafeArchiveError("it is packed suspiciously tightly")


def docx_text(data: bytes, limits: ReadLimits) -> FileText:
    """Paragraphs and tables in document order."""
    return _read(FileKind.DOCX, data, limits, lambda: _docx_lines(data, limits))


def xlsx_text(data: bytes, limits: ReadLimits) -> FileText:
    """The first sheets, their first rows, as tab-separated lines under a heading each."""
    return _read(FileKind.XLSX, data, limits, lambda: _xlsx_lines(data, limits))


def pptx_text(data: bytes, limits: ReadLimits) -> FileText:
    """Each slide's text (shapes, tables, notes) under its number."""
    return _read(FileKind.PPTX, data, limits, lambda: _pptx_lines(data, limits))


MEDIA_TYPES = {
    FileKind.DOCX: "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    FileKind.XLSX: "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    FileKind.PPTX: "application/vnd.openxmlformats-officedocument.presentationml.presentation",
}


def _read(
    kind: FileKind,
    data: bytes,
    limits: ReadLimits,
    lines: Callable[[], tuple[list[str], bool]],
) -> FileText:
    media_type = MEDIA_TYPES[kind]
    try:
        check_archive(data, limits)
        found, truncated = lines()
    except UnsafeArchiveError as exc:
        return FileText(kind, media_type, problem=f"it is not safe to open ({exc})")
    except PARSE_ERRORS as exc:
        reason = (str(exc).splitlines() or [""])[0][:120] or type(exc).__name__
        return FileText(kind, media_type, problem=f"it is damaged ({reason})")
    except RecursionError:
        return FileText(kind, media_type, problem="it is damaged (nested too deeply)")
    text, cut_short = cut("\n".join(found).strip(), limits.max_text_chars)
    return FileText(kind, media_type, text, truncated=truncated or cut_short)


def _docx_lines(data: bytes, limits: ReadLimits) -> tuple[list[str], bool]:
    document = Document(io.BytesIO(data))
    lines: list[str] = []
    size = 0
    for block in document.iter_inner_content():
        if size > limits.max_text_chars:
            return lines, True
        if isinstance(block, Paragraph):
            line = block.text
        elif isinstance(block, Table):
            line = "\n".join(_cells_line(cell.text for cell in row.cells) for row in block.rows)
        else:  # pragma: no cover - python-docx yields only these two
            continue
        lines.append(line)
        size += len(line)
    return lines, False


def _xlsx_lines(data: bytes, limits: ReadLimits) -> tuple[list[str], bool]:
    workbook = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        lines: list[str] = []
        truncated = len(workbook.worksheets) > limits.max_sheets
        size = 0
        for sheet in workbook.worksheets[: limits.max_sheets]:
            lines.append(f"## Sheet: {sheet.title}")
            for number, row in enumerate(sheet.iter_rows(values_only=True)):
                if number >= limits.max_rows or size > limits.max_text_chars:
                    truncated = True
                    break
                values = row[: limits.max_columns]
                truncated = truncated or len(row) > limits.max_columns
                if all(value is None for value in values):
                    continue
                line = _cells_line(_cell(value) for value in values)
                lines.append(line)
                size += len(line)
        return lines, truncated
    finally:
        workbook.close()


def _pptx_lines(data: bytes, limits: ReadLimits) -> tuple[list[str], bool]:
    presentation = Presentation(io.BytesIO(data))
    lines: list[str] = []
    slides = list(presentation.slides)
    for number, slide in enumerate(slides[: limits.max_slides], start=1):
        lines.append(f"## Slide {number}")
        for shape in slide.shapes:
            lines.extend(_shape_lines(shape))
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            notes = slide.notes_slide.notes_text_frame.text.strip()
            if notes:
                lines.append(f"Notes: {notes}")
    return lines, len(slides) > limits.max_slides


def _shape_lines(shape: Any) -> list[str]:
    if getattr(shape, "has_text_frame", False) and shape.text_frame.text.strip():
        return [str(shape.text_frame.text)]
    if getattr(shape, "has_table", False):
        return [_cells_line(cell.text for cell in row.cells) for row in shape.table.rows]
    return []


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _cells_line(cells: Iterable[str]) -> str:
    return "\t".join(cell.replace("\t", " ").replace("\n", " ").strip() for cell in cells)
