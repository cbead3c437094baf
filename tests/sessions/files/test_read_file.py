"""Reading the files people send: every supported kind gives its text; what cannot be read
gets a sentence saying why."""

from __future__ import annotations

import io
import zipfile

import pytest

from sessions.files.extract import read_file
from sessions.files.kinds import FileKind, sniff
from sessions.files.limits import ReadLimits
from tests.sessions.files import samples


def test_a_text_pdf_gives_its_pages_text_in_order() -> None:
    data = samples.pdf(["Invoice 2041\nTotal due: 1,250 EUR", "Payment within 30 days"])
    read = read_file(data, "invoice.pdf", "application/pdf")
    assert (read.kind, read.pages, read.problem) == (FileKind.PDF, 2, "")
    assert read.text.index("Total due: 1,250 EUR") < read.text.index("Payment within 30 days")
    assert "[page 2]" in read.text


def test_a_pdf_beyond_the_page_limit_is_read_in_part_and_says_so() -> None:
    data = samples.pdf([f"Page text {n}" for n in range(1, 13)])
    read = read_file(data, "long.pdf", limits=ReadLimits(max_pages=10))
    assert read.truncated
    assert read.pages == 12
    assert "Page text 10" in read.text
    assert "Page text 11" not in read.text


def test_a_password_protected_pdf_gets_an_honest_sentence() -> None:
    read = read_file(samples.encrypted_pdf("secret terms", "hunter2"), "contract.pdf")
    assert read.kind is FileKind.PDF
    assert read.problem == "it is protected by a password"
    assert "secret" not in read.text


def test_a_pdf_encrypted_without_a_user_password_is_read() -> None:
    read = read_file(samples.encrypted_pdf("open terms", ""), "open.pdf")
    assert read.readable
    assert "open terms" in read.text


def test_a_word_document_gives_paragraphs_and_tables() -> None:
    data = samples.docx(
        ["Termination: either party may end this contract with 90 days notice."],
        table=[["Item", "Price"], ["Anvil", "120"]],
    )
    read = read_file(data, "contract.docx")
    assert read.kind is FileKind.DOCX
    assert "90 days notice" in read.text
    assert "Anvil\t120" in read.text


def test_a_workbook_gives_its_first_sheets_and_rows_as_a_table() -> None:
    data = samples.xlsx(
        {
            "Q1": [["Region", "Sales"], ["North", 42], ["South", 17.5]],
            "Q2": [["Region", "Sales"], ["North", 50]],
            "Hidden": [["x"]],
        }
    )
    read = read_file(data, "sales.xlsx", limits=ReadLimits(max_sheets=2))
    assert read.kind is FileKind.XLSX
    assert read.truncated
    assert "## Sheet: Q1\nRegion\tSales\nNorth\t42\nSouth\t17.5" in read.text
    assert "## Sheet: Q2" in read.text
    assert "Hidden" not in read.text


def test_a_workbook_is_cut_at_the_row_limit() -> None:
    read = read_file(samples.big_xlsx(50, columns=3), "big.xlsx", limits=ReadLimits(max_rows=10))
    assert read.truncated
    assert "r9c1" in read.text
    assert "r10c1" not in read.text


def test_a_presentation_gives_each_slide_with_tables_and_notes() -> None:
    data = samples.pptx([("Roadmap", "Ship files in May"), ("Risks", "Hiring")], notes="Say thanks")
    read = read_file(data, "deck.pptx")
    assert read.kind is FileKind.PPTX
    assert read.text.index("## Slide 1") < read.text.index("Ship files in May")
    assert read.text.index("## Slide 2") < read.text.index("Hiring")
    assert "Notes: Say thanks" in read.text
    assert "North\t42" in read.text


@pytest.mark.parametrize(
    ("name", "data", "kind", "expected"),
    [
        ("rates.csv", b'name,rate\n"Smith, J",12\n', FileKind.CSV, "Smith, J\t12"),
        ("rates.tsv", b"name\trate\nSmith\t12\n", FileKind.TSV, "Smith\t12"),
        ("notes.md", b"# Title\n\n- point", FileKind.MARKDOWN, "# Title"),
        ("data.json", b'{"a": [1, 2]}', FileKind.JSON, '"a": [\n  1,\n  2\n ]'),
        (
            "page.html",
            b"<html><body><p>Hello <b>there</b></p></body></html>",
            FileKind.HTML,
            "Hello there",
        ),
        ("plain.txt", "Grüße aus Köln".encode(), FileKind.TEXT, "Grüße aus Köln"),
        ("legacy.txt", "Grüße".encode("cp1252"), FileKind.TEXT, "Grüße"),
        ("utf16.txt", "Ünïcode".encode("utf-16"), FileKind.TEXT, "Ünïcode"),
    ],
)
def test_text_files_are_read_by_kind(name: str, data: bytes, kind: FileKind, expected: str) -> None:
    read = read_file(data, name)
    assert read.kind is kind
    assert expected in read.text


def test_an_attached_mail_gives_headers_body_and_attachment_names() -> None:
    read = read_file(samples.eml("Quote for anvils", "We offer 12 anvils.", "quote.pdf"), "fwd.eml")
    assert read.kind is FileKind.EMAIL
    assert "Subject: Quote for anvils" in read.text
    assert "We offer 12 anvils." in read.text
    assert "Attachments: quote.pdf" in read.text


def test_a_msg_file_that_is_really_a_mail_is_read_as_one() -> None:
    read = read_file(samples.eml("Hi", "Body text"), "outlook.msg")
    assert read.kind is FileKind.EMAIL
    assert "Body text" in read.text


def test_the_bytes_decide_the_kind_not_the_name_or_declared_type() -> None:
    assert sniff(samples.pdf(["x"]), "notes.txt", "text/plain").kind is FileKind.PDF
    assert sniff(samples.docx(["x"]), "photo.png", "image/png").kind is FileKind.DOCX
    assert sniff(samples.image(2, 2), "report.pdf", "application/pdf").kind is FileKind.IMAGE
    assert (
        sniff(b"\x7fELF\x02\x01\x01\x00" + bytes(64), "cat.png", "image/png").kind
        is FileKind.BINARY
    )


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(600), "password-protected or legacy"),
        (b"PK\x03\x04" + bytes(40), "not a kind of file I can read"),
        (b"\x00\x01\x02\x03" * 100, "not a kind of file I can read"),
    ],
)
def test_files_that_cannot_be_read_say_why(data: bytes, problem: str) -> None:
    read = read_file(data, "mystery.bin")
    assert problem in read.problem
    assert read.text == ""


def test_a_plain_zip_is_not_unpacked() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("a.txt", "inside")
    read = read_file(out.getvalue(), "files.zip")
    assert read.kind is FileKind.ARCHIVE
    assert "ZIP archive" in read.problem


def test_an_office_file_that_unpacks_to_too_much_is_refused_before_parsing() -> None:
    read = read_file(
        samples.zip_bomb_docx(30),
        "bomb.docx",
        limits=ReadLimits(max_unpacked_bytes=20 * 1024 * 1024),
    )
    assert read.kind is FileKind.DOCX
    assert read.problem.startswith("it is not safe to open")


def test_an_office_file_packed_suspiciously_tightly_is_refused() -> None:
    read = read_file(samples.zip_bomb_docx(8), "bomb.docx", limits=ReadLimits(max_pack_ratio=100))
    assert read.problem == "it is not safe to open (it is packed suspiciously tightly)"


def test_json_nested_absurdly_deep_is_kept_as_written_without_recursing() -> None:
    read = read_file(samples.deep_json(100_000), "deep.json")
    assert read.readable
    assert read.text.startswith("[[[[")


@pytest.mark.parametrize("cut_at", [20, 200, 400])
def test_a_truncated_pdf_is_damaged_or_partly_read_never_an_error(cut_at: int) -> None:
    data = samples.pdf(["Some words on a page", "More words"])[:cut_at]
    read = read_file(data, "broken.pdf")
    assert read.kind is FileKind.PDF
    assert read.problem.startswith("it is damaged") or read.readable


def test_a_truncated_word_document_is_damaged() -> None:
    data = samples.docx(["hello"] * 50)
    read = read_file(data[: len(data) // 2], "cut.docx")
    # Cut in half, the ZIP's directory (at its end) is gone: it is no Office file any more.
    assert not read.readable
    assert read.text == ""


def test_text_over_the_limit_is_cut_and_marked() -> None:
    read = read_file(
        ("line of text\n" * 10_000).encode(), "long.txt", limits=ReadLimits(max_text_chars=1000)
    )
    assert read.truncated
    assert len(read.text) <= 1000
