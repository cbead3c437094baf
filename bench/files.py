"""Reading the files people send: how long extraction takes and how much memory it needs.

Prints one JSON object: for a 20-page text PDF (goal ≤ 300 ms) and a 5 MB workbook (goal
≤ 1 s), plus a Word file, a presentation and a large photo scaled for the model, the median
and worst of `--runs` reads in this process, and the peak resident memory of a child process
that reads each once, beside that of one given the file without reading it. The files
are built here, like the tests build theirs.

    .venv/bin/python bench/files.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessions.files.blocks import file_blocks
from sessions.files.extract import read_file
from tests.sessions.files import samples

GOALS_MS = {"pdf_20_pages": 300.0, "xlsx_5_mb": 1000.0}


def builders() -> dict[str, tuple[str, Callable[[], bytes]]]:
    """The files measured: name → (file name, builder)."""
    page = "\n".join(
        f"Line {line} of the quarterly report, with figures {line * 17}." for line in range(40)
    )
    return {
        "pdf_20_pages": ("report.pdf", lambda: samples.pdf([page] * 20)),
        "xlsx_5_mb": ("sales.xlsx", lambda: _xlsx_of_bytes(5 * 1024 * 1024)),
        "docx_200_paragraphs": ("contract.docx", lambda: samples.docx([page[:400]] * 200)),
        "pptx_50_slides": ("deck.pptx", lambda: samples.pptx([("Slide", page[:300])] * 50)),
        "photo_4000x3000_jpeg": ("photo.jpg", lambda: samples.image(4000, 3000, fmt="JPEG")),
    }


def _xlsx_of_bytes(size: int) -> bytes:
    rows = 20_000
    while True:
        data = samples.big_xlsx(rows, columns=12)
        if len(data) >= size:
            return data
        rows = int(rows * size / len(data) * 1.05) + 1


def _read(name: str, data: bytes) -> None:
    read = read_file(data, name)
    file_blocks(name, data, read)


def _peak_child(name: str, data: bytes, read: bool, queue: multiprocessing.Queue[int]) -> None:
    if read:
        _read(name, data)
    queue.put(_high_water_kib())


def _high_water_kib() -> int:
    """The process's peak resident set (VmHWM): unlike `ru_maxrss`, it starts anew at exec,
    so a spawned child does not report its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _child_peak(name: str, data: bytes, *, read: bool) -> int:
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[int] = context.Queue()
    process = context.Process(target=_peak_child, args=(name, data, read, queue))
    process.start()
    peak = queue.get(timeout=300)
    process.join()
    return peak


def peaks_mib(name: str, data: bytes) -> tuple[float, float]:
    """Peak resident memory (MiB) of a child process reading the file once, and of one that
    was given the same file but did not read it (the interpreter, the libraries, the bytes)."""
    reading = _child_peak(name, data, read=True)
    idle = _child_peak(name, data, read=False)
    return round(reading / 1024, 1), round(idle / 1024, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="reads per file (5)")
    args = parser.parse_args()
    figures: dict[str, object] = {}
    for key, (name, build) in builders().items():
        data = build()
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            _read(name, data)
            times.append((time.perf_counter() - started) * 1000)
        entry: dict[str, object] = {
            "bytes": len(data),
            "ms_p50": round(statistics.median(times), 1),
            "ms_max": round(max(times), 1),
        }
        entry["peak_rss_mib"], entry["peak_rss_mib_without_reading"] = peaks_mib(name, data)
        if key in GOALS_MS:
            entry["goal_ms"] = GOALS_MS[key]
            entry["met"] = max(times) <= GOALS_MS[key]
        figures[key] = entry
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
