"""What `gateway config check` prints for a config file, one line per problem."""

from __future__ import annotations

from pathlib import Path

from gateway.config import check_config


def problem_lines(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    """Each problem found in the file, as the line the check prints for it."""
    return [str(problem) for problem in check_config(path, environ or {})]
