"""Profiling a process under benchmark: py-spy attached for a block (speedscope JSON), and
the top functions of a cProfile file when py-spy is not installed."""

from __future__ import annotations

import contextlib
import pstats
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchkit import progress
from routing import PROJECT_ROOT


def py_spy() -> str | None:
    """py-spy, in the project's virtualenv or on the PATH."""
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def profile_top(path: Path, count: int = 15) -> dict[str, list[str]]:
    """The top functions of a cProfile file, by cumulative and by own time, and the own time
    by package (cProfile sees the main thread only, and times wall clock: idle waiting shows
    as `select.epoll.poll`)."""
    entries: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    entries = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]

    def name(key: tuple[str, int, str]) -> str:
        filename, line, function = key
        short = re.sub(r".*/(site-packages|lib/python3\.\d+)/", "", filename)
        short = short.removeprefix(str(PROJECT_ROOT) + "/")
        return f"{short}:{line}({function})"

    def package(key: tuple[str, int, str]) -> str:
        filename, _, function = key
        found = re.search(r"site-packages/([^/]+)", filename)
        if found:
            return found.group(1)
        if filename.startswith(str(PROJECT_ROOT)):
            return filename.removeprefix(str(PROJECT_ROOT) + "/").split("/")[0]
        if filename == "~":
            return function  # a builtin: epoll's poll is the idle loop
        found = re.search(r"lib/python3\.\d+/([^/]+)", filename)
        return f"stdlib {found.group(1).removesuffix('.py')}" if found else filename

    def top(column: int) -> list[str]:
        ranked = sorted(entries.items(), key=lambda item: -item[1][column])[:count]
        return [f"{value[column]:8.2f}s calls={value[1]:<8} {name(key)}" for key, value in ranked]

    by_package: Counter[str] = Counter()
    for key, value in entries.items():
        by_package[package(key)] += value[2]
    total = sum(by_package.values()) or 1.0
    return {
        "by_cumulative": top(3),
        "by_self": top(2),
        "self_by_package": [
            f"{seconds:8.2f}s {100 * seconds / total:5.1f}% {label}"
            for label, seconds in by_package.most_common(count)
        ],
    }


@contextlib.contextmanager
def py_spy_attached(pid: int, output: Path) -> Iterator[None]:
    """Sample the gateway with py-spy for the duration of the block."""
    command = [str(py_spy()), "record", "--pid", str(pid), "--output", str(output)]
    command += ["--format", "speedscope", "--rate", "100", "--nonblocking"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            _, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
        if process.returncode not in (0, -signal.SIGINT):
            progress(f"py-spy failed: {stderr.decode(errors='replace')[-500:]}")
