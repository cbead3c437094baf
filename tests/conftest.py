"""Fixtures shared by every test: real databases (SQLite file, PostgreSQL server)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import make_url

from storage.database import Database
from storage.models import Base

POSTGRES_ADMIN_URL = os.environ.get(
    "GATEWAY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL database for this test run, dropped at the end."""
    name = f"gateway_test_{uuid.uuid4().hex[:12]}"
    admin = _libpq_url(POSTGRES_ADMIN_URL)
    try:
        connection = psycopg.connect(admin, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required for these tests ({POSTGRES_ADMIN_URL}): {exc}")
    with connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _migrate(url: str) -> None:
    database = Database(url)
    try:
        await database.upgrade()
    finally:
        await database.dispose()


@pytest.fixture(scope="session")
def migrated_postgres(postgres_url: str) -> str:
    """The run's PostgreSQL database with every migration applied once."""
    # A thread of its own: the fixture may be set up while a test's event loop is running.
    with ThreadPoolExecutor(max_workers=1) as executor:
        executor.submit(asyncio.run, _migrate(postgres_url)).result()
    return postgres_url


async def _empty_all_tables(database: Database) -> None:
    async with database.session() as session:
        for table in reversed(Base.metadata.sorted_tables):
            await session.execute(table.delete())


@pytest.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A migrated, empty database on each backend; PostgreSQL is emptied after each test."""
    if request.param == "sqlite":
        database = Database(f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}")
        await database.upgrade()
        yield database
        await database.dispose()
        return
    url = request.getfixturevalue("migrated_postgres")
    database = Database(url, pool_size=4)
    try:
        yield database
    finally:
        await _empty_all_tables(database)
        await database.dispose()
