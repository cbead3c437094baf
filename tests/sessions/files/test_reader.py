"""The file reader runs extraction in child processes: a file that takes too long is cut off
and the next file is still read; the event loop never waits on a parser."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sessions.files.kinds import FileKind
from sessions.files.limits import ReadLimits
from sessions.files.reader import FileReader
from tests.sessions.files import samples


@pytest.fixture
async def reader() -> AsyncIterator[FileReader]:
    files = FileReader(ReadLimits(seconds=30))
    yield files
    files.close()


async def test_files_are_read_in_a_child_process(reader: FileReader) -> None:
    read = await reader.read(samples.docx(["from the child"]), "a.docx")
    assert read.kind is FileKind.DOCX
    assert "from the child" in read.text


async def test_a_file_that_takes_too_long_is_cut_off_and_the_next_one_is_read() -> None:
    slow = FileReader(ReadLimits(seconds=30, max_rows=1_000_000))
    try:
        warm = await slow.read(b"the child is up", "note.txt")  # its start is not timed
        assert warm.text == "the child is up"
        # Parsing a 10,000-row workbook takes far more than the 20 ms allowed now.
        slow.limits = ReadLimits(seconds=0.02, max_rows=1_000_000)
        read = await slow.read(samples.big_xlsx(10_000), "big.xlsx")
        assert read.problem == "it took too long to read"
        assert read.kind is FileKind.XLSX
        slow.limits = ReadLimits(seconds=30)
        after = await slow.read(b"still working", "note.txt")
        assert after.text == "still working"
    finally:
        slow.close()


async def test_a_file_needing_more_memory_than_the_cap_is_refused(reader: FileReader) -> None:
    capped = FileReader(ReadLimits(seconds=60), memory_limit=700 * 1024 * 1024)
    try:
        # 300 MB of text: the child cannot hold the bytes and their decoded copy under 700 MB.
        read = await capped.read(b"a" * (300 * 1024 * 1024), "huge.txt")
        assert read.problem == "it needs too much memory to read"
        after = await capped.read(b"small", "small.txt")
        assert after.text == "small"
    finally:
        capped.close()
