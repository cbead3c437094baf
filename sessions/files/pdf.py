"""Text of a PDF (pypdf: BSD-licensed, pure Python, maintained), page by page within limits."""

from __future__ import annotations

import io
import logging

from pypdf import PdfReader
from pypdf.errors import PdfReadError, PyPdfError

from sessions.files.kinds import FileKind
from sessions.files.limits import FileText, ReadLimits, cut

MEDIA_TYPE = "application/pdf"

# pypdf reports every repairable oddity of a damaged file on its logger; the outcome (text or
# a problem) is what matters here, and the gateway's own log line says it.
logging.getLogger("pypdf").setLevel(logging.ERROR)


def pdf_text(data: bytes, limits: ReadLimits) -> FileText:
    """The PDF's text, pages separated by form feeds' worth of blank lines."""
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not _opens_without_password(reader):
            return FileText(FileKind.PDF, MEDIA_TYPE, problem="it is protected by a password")
        page_count = len(reader.pages)
        parts: list[str] = []
        size = 0
        truncated = page_count > limits.max_pages
        for number, page in enumerate(reader.pages):
            if number >= limits.max_pages or size > limits.max_text_chars:
                truncated = True
                break
            text = page.extract_text() or ""
            parts.append(f"[page {number + 1}]\n{text.strip()}")
            size += len(text)
    except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError, IndexError) as exc:
        return FileText(FileKind.PDF, MEDIA_TYPE, problem=f"it is damaged ({_reason(exc)})")
    except RecursionError:
        return FileText(FileKind.PDF, MEDIA_TYPE, problem="it is damaged (nested too deeply)")
    text, cut_short = cut("\n\n".join(parts), limits.max_text_chars)
    return FileText(
        FileKind.PDF, MEDIA_TYPE, text, truncated=truncated or cut_short, pages=page_count
    )


def _opens_without_password(reader: PdfReader) -> bool:
    """Many PDFs are encrypted with an empty user password (only editing is restricted)."""
    try:
        return bool(reader.decrypt(""))
    except (PdfReadError, PyPdfError, NotImplementedError, ValueError):
        return False


def _reason(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:120] or type(exc).__name__
