"""Fixtures for the gateway tests: config files written from YAML text."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[str], Path]:
    """Write a dedented YAML text to a file and return its path."""

    def write(text: str) -> Path:
        path = tmp_path / "gateway.yaml"
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return write
