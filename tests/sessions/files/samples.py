"""Files built in the tests: real PDFs, Word, Excel and PowerPoint files, images, and hostile
variants of them. Nothing is read from disk or the network."""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from email.message import EmailMessage

from docx import Document
from openpyxl import Workbook
from PIL import Image
from pptx import Presentation
from pptx.util import Inches
from pypdf import PdfReader, PdfWriter


def pdf(pages: list[str]) -> bytes:
    """A text PDF, one string per page (Helvetica, one line per text line)."""
    objects: list[bytes] = []
    page_ids = [3 + 2 * index for index in range(len(pages))]
    font_id = 3 + 2 * len(pages)
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    kids = " ".join(f"{page_id} 0 R" for page_id in page_ids)
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    for index, text in enumerate(pages):
        content_id = page_ids[index] + 1
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {content_id} 0 R "
            f"/Resources << /Font << /F1 {font_id} 0 R >> >> >>".encode()
        )
        lines = [
            "(" + line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ") Tj T*"
            for line in text.splitlines()
        ]
        stream = ("BT /F1 11 Tf 14 TL 72 720 Td " + " ".join(lines) + " ET").encode("latin-1")
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(
        b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    )
    return out.getvalue()


def encrypted_pdf(text: str, password: str) -> bytes:
    """A PDF that opens only with `password`."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf([text]))))
    writer.encrypt(user_password=password, owner_password=password + "-owner")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def docx(paragraphs: list[str], table: list[list[str]] | None = None) -> bytes:
    """A Word document: paragraphs, then a table."""
    document = Document()
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for row, values in zip(grid.rows, table, strict=True):
            for cell, value in zip(row.cells, values, strict=True):
                cell.text = value
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def xlsx(sheets: dict[str, list[list[object]]]) -> bytes:
    """A workbook, one sheet per entry."""
    workbook = Workbook()
    workbook.remove(workbook.active)  # type: ignore[arg-type]
    for title, rows in sheets.items():
        sheet = workbook.create_sheet(title)
        for row in rows:
            sheet.append(row)
    out = io.BytesIO()
    workbook.save(out)
    return out.getvalue()


def big_xlsx(rows: int, columns: int = 10) -> bytes:
    """A workbook of one large sheet (numbers and words)."""
    return xlsx(
        {
            "Data": [
                [f"r{row}c{col}" if col % 2 else row * col for col in range(columns)]
                for row in range(rows)
            ]
        }
    )


def pptx(slides: list[tuple[str, str]], notes: str = "") -> bytes:
    """A presentation: (title, body) per slide; notes on the first."""
    presentation = Presentation()
    for title, body in slides:
        slide = presentation.slides.add_slide(presentation.slide_layouts[1])
        slide.shapes.title.text = title  # type: ignore[union-attr]
        slide.placeholders[1].text = body  # type: ignore[attr-defined]
    if notes:
        presentation.slides[0].notes_slide.notes_text_frame.text = notes  # type: ignore[union-attr]
    extra = presentation.slides[0].shapes.add_table(
        2, 2, Inches(1), Inches(5), Inches(4), Inches(1)
    )
    extra.table.cell(0, 0).text = "Region"
    extra.table.cell(0, 1).text = "Sales"
    extra.table.cell(1, 0).text = "North"
    extra.table.cell(1, 1).text = "42"
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def image(width: int, height: int, fmt: str = "PNG", mode: str = "RGB") -> bytes:
    """A picture of the given size."""
    picture = Image.new(mode, (width, height), color=(200, 30, 30) if mode == "RGB" else None)
    out = io.BytesIO()
    picture.save(out, format=fmt)
    return out.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims an enormous picture (a decompression bomb's shape)."""
    data = bytearray(image(1, 1))
    # The IHDR chunk: its type at 12..16, width and height at 16..24, its CRC at 29..33.
    data[16:20] = width.to_bytes(4, "big")
    data[20:24] = height.to_bytes(4, "big")
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def zip_bomb_docx(unpacked_mb: int) -> bytes:
    """A real Word document with one extra part of `unpacked_mb` MB of zeros, packed tightly."""
    base = zipfile.ZipFile(io.BytesIO(docx(["hello"])))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bomb:
        for info in base.infolist():
            bomb.writestr(info, base.read(info))
        with bomb.open("word/media/zeros.bin", "w") as member:
            chunk = bytes(1024 * 1024)
            for _ in range(unpacked_mb):
                member.write(chunk)
    return out.getvalue()


def deep_json(depth: int) -> bytes:
    """JSON nested `depth` levels deep."""
    return ("[" * depth + "]" * depth).encode()


def eml(subject: str, body: str, attachment: str = "") -> bytes:
    """A mail as an `.eml` file, with an attachment's name when given."""
    message = EmailMessage()
    message["From"] = "Carol <carol@example.com>"
    message["To"] = "alice@acme.example"
    message["Subject"] = subject
    message.set_content(body)
    if attachment:
        message.add_attachment(
            b"data", maintype="application", subtype="octet-stream", filename=attachment
        )
    return bytes(message)


def json_file(value: object) -> bytes:
    """A JSON file."""
    return json.dumps(value).encode()
