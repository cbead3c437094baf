"""CPU time of one log line as the gateway writes it (`gateway.log.configure_logging`, JSON):
a turn's line at info with the turn's context bound, one below the level, and a library's
record through the standard library (uvicorn's, botocore's), stderr going to a file.

    .venv/bin/python bench/log_lines.py                # 20,000 lines each, 5 rounds
    .venv/bin/python bench/log_lines.py --lines 50000

Printed as one JSON object: `us_per_line` (median, best, worst round of CPU time divided by
the lines) for `gateway_info`, `gateway_below_level` and `library_info`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchkit import run_and_print_json

from gateway.log import bind_turn_context, clear_turn_context, configure_logging, get_logger


def measure(lines: int, rounds: int) -> dict[str, Any]:
    """Each kind of line, `rounds` rounds of `lines` lines, stderr in a temporary file."""
    ours = get_logger("gateway.turns")
    library = logging.getLogger("botocore.endpoint")

    def gateway_info(number: int) -> None:
        ours.info("turn.answered", seq=number, input_tokens=1234, output_tokens=56)

    def gateway_debug(number: int) -> None:
        ours.debug("turn.detail", seq=number)

    def library_info(number: int) -> None:
        library.info("Sending http request: %s", number)

    kinds: dict[str, Callable[[int], None]] = {
        "gateway_info": gateway_info,
        "gateway_below_level": gateway_debug,
        "library_info": library_info,
    }
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryFile("w+") as sink, contextlib.redirect_stderr(sink):
        configure_logging("json", "info")
        bind_turn_context(
            session_id="4f1c2a0e-8b7d-4e0a-9a51-2d6d3b9c1e77",
            user_id="slack-1234567890abcdef",
            channel="slack",
        )
        for name, write in kinds.items():
            per_line = []
            for _ in range(rounds):
                started = time.process_time()
                for number in range(lines):
                    write(number)
                per_line.append((time.process_time() - started) / lines * 1e6)
            figures[name] = {
                "median": round(statistics.median(per_line), 2),
                "best": round(min(per_line), 2),
                "worst": round(max(per_line), 2),
            }
        clear_turn_context()
    return {"lines": lines, "rounds": rounds, "us_per_line": figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20_000, help="lines a round (20000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each kind (5)")
    args = parser.parse_args()
    return run_and_print_json(lambda: measure(args.lines, args.rounds), lambda _: 0)


if __name__ == "__main__":
    sys.exit(main())
