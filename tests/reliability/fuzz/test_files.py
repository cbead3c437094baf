"""Fuzzing the file readers: valid PDFs, Office files, images, mails and text, mutated (bytes
flipped, cut short, spliced, given the wrong name), never make `read_file` raise or run long,
and the child-process reader answers every one of them."""

from __future__ import annotations

import time
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from sessions.files.blocks import file_blocks
from sessions.files.extract import read_file
from sessions.files.limits import ReadLimits
from sessions.files.reader import FileReader
from tests.reliability.fuzz.harness import FUZZ
from tests.sessions.files import samples

SECONDS_PER_FILE = 5.0

SEEDS: dict[str, Callable[[], bytes]] = {
    "report.pdf": lambda: samples.pdf(["Quarterly report", "Revenue 12\nCosts 7"]),
    "contract.docx": lambda: samples.docx(["Clause 1", "Clause 2"], [["a", "b"], ["c", "d"]]),
    "sales.xlsx": lambda: samples.xlsx({"S": [["x", 1], ["y", 2.5]]}),
    "deck.pptx": lambda: samples.pptx([("Title", "Body")], notes="n"),
    "shot.png": lambda: samples.image(64, 48),
    "photo.jpg": lambda: samples.image(64, 48, fmt="JPEG"),
    "mail.eml": lambda: samples.eml("Subject", "Body", "a.pdf"),
    "data.json": lambda: samples.json_file({"a": [1, {"b": "c"}]}),
    "rows.csv": lambda: b'a,b\n"1,2",3\n',
    "page.html": lambda: b"<html><body><p>Hi <i>there</i></p></body></html>",
}
SEED_BYTES = {name: build() for name, build in SEEDS.items()}


@st.composite
def mutated_files(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """A seed file, changed the way damaged or hostile files are."""
    name = draw(st.sampled_from(sorted(SEED_BYTES)))
    data = bytearray(SEED_BYTES[name])
    for _ in range(draw(st.integers(0, 8))):
        how = draw(st.sampled_from(["flip", "cut", "splice", "insert"]))
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        if how == "flip" and data:
            data[position] = draw(st.integers(0, 255))
        elif how == "cut":
            del data[position:]
        elif how == "splice":
            other = SEED_BYTES[draw(st.sampled_from(sorted(SEED_BYTES)))]
            data[position:position] = other[: draw(st.integers(0, len(other)))]
        else:
            data[position:position] = draw(st.binary(max_size=64))
    claimed = draw(
        st.sampled_from([name, *sorted(SEED_BYTES), "../../etc/passwd", "a\x00b.pdf", ""])
    )
    declared = draw(st.sampled_from(["", "application/pdf", "image/png", "text/plain", "text/csv"]))
    return claimed, bytes(data), declared


@settings(FUZZ, max_examples=400)
@given(mutated_files())
def test_read_file_never_raises_or_runs_long_on_damaged_files(case: tuple[str, bytes, str]) -> None:
    name, data, declared = case
    started = time.perf_counter()
    read = read_file(data, name, declared, ReadLimits())
    shown = file_blocks(name, data, read)
    assert time.perf_counter() - started < SECONDS_PER_FILE
    # Every file ends as something the model sees or a sentence the user gets.
    assert shown.blocks or shown.problem or read.text == ""


async def test_the_child_reader_answers_every_damaged_file() -> None:
    reader = FileReader(ReadLimits(seconds=SECONDS_PER_FILE))
    try:
        for index, data in enumerate(_damaged_batch()):
            read = await reader.read(data, f"file{index}.bin")
            assert read.text or read.problem or read.kind
    finally:
        reader.close()


def _damaged_batch() -> list[bytes]:
    batch = []
    for name, data in sorted(SEED_BYTES.items()):
        batch.extend([data[: len(data) // 3], data[::-1], data[:20] + bytes(200) + data[220:]])
        del name
    return batch
