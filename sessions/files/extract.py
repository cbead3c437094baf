"""`read_file`: the text of any file a person sent, within limits, never raising for what the
file holds. A file the assistant cannot read gets a `problem` sentence instead of text.

Parsers of third-party formats fail in many ways on hostile input; each reader catches the
errors its library is known to raise, and `read_file` is the boundary that turns anything
else into "damaged" too, so one bad attachment can never fail a turn.
"""

from __future__ import annotations

import csv
import email
import email.policy
import io
import json
from collections.abc import Callable
from email.message import EmailMessage, MIMEPart

from inscriptis import get_text  # type: ignore[import-untyped]

from sessions.files.images import ImageProblemError, fit_image
from sessions.files.kinds import FileKind, FileType, decode_text, sniff
from sessions.files.limits import FileText, ReadLimits, cut
from sessions.files.office import docx_text, pptx_text, xlsx_text
from sessions.files.pdf import pdf_text

UNSUPPORTED = {
    FileKind.ENCRYPTED_OFFICE: "it is a password-protected or legacy (pre-2007) Office file",
    FileKind.ARCHIVE: "it is a ZIP archive, which I do not unpack",
    FileKind.BINARY: "it is not a kind of file I can read",
}
Reader = Callable[[bytes, ReadLimits], FileText]
BINARY_READERS: dict[FileKind, Reader] = {
    FileKind.PDF: pdf_text,
    FileKind.DOCX: docx_text,
    FileKind.XLSX: xlsx_text,
    FileKind.PPTX: pptx_text,
}


def read_file(
    data: bytes, name: str = "", declared_type: str = "", limits: ReadLimits | None = None
) -> FileText:
    """The file's kind and text (or why there is none)."""
    limits = limits or ReadLimits()
    found = sniff(data, name, declared_type)
    if found.kind in UNSUPPORTED:
        return FileText(found.kind, found.media_type, problem=UNSUPPORTED[found.kind])
    if found.kind is FileKind.IMAGE:
        # Images are shown to the model as pictures (fitted to the API's limits here, in the
        # reader's child); they have no text of their own.
        try:
            fitted = fit_image(data, found.media_type)
        except ImageProblemError as exc:
            return FileText(found.kind, found.media_type, problem=str(exc))
        return FileText(found.kind, found.media_type, image=fitted)
    reader = BINARY_READERS.get(found.kind)
    try:
        if reader is not None:
            return reader(data, limits)
        return _text_file(found, decode_text(data), limits)
    except Exception as exc:  # noqa: BLE001
        # The boundary described in the module docstring: a parser's unexpected failure on
        # a hostile file is that file's problem, not the turn's.
        return FileText(
            found.kind, found.media_type, problem=f"it is damaged ({type(exc).__name__})"
        )


def _text_file(found: FileType, text: str, limits: ReadLimits) -> FileText:
    kind = found.kind
    truncated = False
    if kind in (FileKind.CSV, FileKind.TSV):
        text, truncated = _table_text(text, "\t" if kind is FileKind.TSV else ",", limits)
    elif kind is FileKind.HTML:
        text = get_text(text[: limits.max_text_chars * 4])
    elif kind is FileKind.JSON:
        text = _json_text(text, limits)
    elif kind is FileKind.EMAIL:
        text = _email_text(text, limits)
    text, cut_short = cut(text.strip(), limits.max_text_chars)
    return FileText(kind, found.media_type, text, truncated=truncated or cut_short)


def _table_text(text: str, delimiter: str, limits: ReadLimits) -> tuple[str, bool]:
    """Rows as tab-separated lines (quotes resolved), the first `max_rows` of them."""
    lines: list[str] = []
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    try:
        for number, row in enumerate(reader):
            if number >= limits.max_rows:
                return "\n".join(lines), True
            lines.append("\t".join(cell.replace("\t", " ").strip() for cell in row))
    except csv.Error:
        # A malformed row (an unclosed quote): what was read so far, then the raw rest.
        rest = text.splitlines()[len(lines) : limits.max_rows]
        lines.extend(rest)
    return "\n".join(lines), False


def _json_text(text: str, limits: ReadLimits) -> str:
    """Pretty-printed when it parses and is not nested absurdly deep; else as written."""
    if _nesting(text) > limits.max_json_depth:
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return json.dumps(value, indent=1, ensure_ascii=False)


def _nesting(text: str) -> int:
    """The deepest bracket nesting, counted without parsing (cheap and recursion-free)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped = not escaped and char == "\\"
            in_string = escaped or char != '"'
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _email_text(text: str, limits: ReadLimits) -> str:
    """An attached mail: its headers, its text body, and the names of its own attachments."""
    message = email.message_from_string(
        text[: limits.max_text_chars * 4], policy=email.policy.default
    )
    if not isinstance(message, EmailMessage):  # pragma: no cover - the policy makes these
        return text
    lines = [
        f"{header}: {message[header]}"
        for header in ("From", "To", "Cc", "Date", "Subject")
        if message[header]
    ]
    body = message.get_body(preferencelist=("plain", "html"))
    if body is not None:
        content = _part_text(body)
        lines.extend(["", get_text(content) if body.get_content_type() == "text/html" else content])
    names = [part.get_filename() for part in message.iter_attachments() if part.get_filename()]
    if names:
        lines.extend(["", "Attachments: " + ", ".join(str(name) for name in names)])
    return "\n".join(lines)


def _part_text(part: MIMEPart) -> str:
    try:
        content = part.get_content()
    except (LookupError, ValueError, AssertionError):
        payload = part.get_payload(decode=True)
        return payload.decode("utf-8", errors="replace") if isinstance(payload, bytes) else ""
    return content if isinstance(content, str) else ""
