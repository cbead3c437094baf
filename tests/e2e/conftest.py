"""Fixtures for end-to-end tests: a database URL per backend."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database on each backend (PostgreSQL: a throwaway database per test)."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))
