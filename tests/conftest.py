"""Fixtures shared by every test: real databases (SQLite file, PostgreSQL server) and a real
S3-compatible server (moto in server mode) over HTTP on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from moto.server import ThreadedMotoServer
from sqlalchemy import make_url

from storage.database import Database
from storage.models import Base
from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.fakes.slack_api import FakeSlackAPI
from tests.fakes.smtp_sink import SmtpSink

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


@contextlib.contextmanager
def scratch_postgres(template: str | None = None) -> Iterator[str]:
    """The URL of a PostgreSQL database of its own (empty, or a copy of `template`), dropped
    afterwards."""
    name = f"gateway_e2e_{uuid.uuid4().hex[:12]}"
    admin = _libpq_url(POSTGRES_ADMIN_URL)
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"{copy}')
    yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fresh_postgres_url() -> Iterator[str]:
    """An empty PostgreSQL database of its own for one test, dropped afterwards."""
    with scratch_postgres() as url:
        yield url


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """The name of a PostgreSQL database with every migration applied once per run, which
    nobody connects to afterwards, so that `CREATE DATABASE … TEMPLATE` can copy it (copying
    takes ~0.1 s, migrating an empty database ~1 s)."""
    name = f"gateway_template_{uuid.uuid4().hex[:12]}"
    admin = _libpq_url(POSTGRES_ADMIN_URL)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    with ThreadPoolExecutor(max_workers=1) as executor:
        executor.submit(asyncio.run, _migrate(url)).result()
    yield name
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def migrated_postgres_url(postgres_template: str) -> Iterator[str]:
    """A migrated, empty PostgreSQL database of its own for one test (a copy of the
    template), dropped afterwards."""
    with scratch_postgres(postgres_template) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of its own on each backend, migrated and empty (a copy of one migrated once
    per run: the gateway's migrating at start-up finds nothing to do; starting on an empty
    database is tested with `fresh_postgres_url` and in tests/gateway/test_cli.py)."""
    if request.param == "sqlite":
        path = tmp_path / "gateway.db"
        shutil.copyfile(request.getfixturevalue("migrated_sqlite"), path)
        return f"sqlite+aiosqlite:///{path}"
    return str(request.getfixturevalue("migrated_postgres_url"))


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of its own on each backend, for tests of the migrations themselves."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


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


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file with every migration applied once, copied for each test that needs a
    migrated database (migrating costs far more than copying)."""
    path = tmp_path_factory.mktemp("template") / "gateway.db"
    with ThreadPoolExecutor(max_workers=1) as executor:
        executor.submit(asyncio.run, _migrate(f"sqlite+aiosqlite:///{path}")).result()
    # The last connection closed has checkpointed the write-ahead log into the file.
    assert not path.with_name("gateway.db-wal").exists()
    return path


@pytest.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A migrated, empty database on each backend; PostgreSQL is emptied after each test."""
    if request.param == "sqlite":
        path = tmp_path / "gateway.db"
        shutil.copyfile(request.getfixturevalue("migrated_sqlite"), path)
        database = Database(f"sqlite+aiosqlite:///{path}")
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


REGION = "us-east-1"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """Start moto in server mode on a free loopback port; yield its URL, stop it at the end."""
    with pytest.MonkeyPatch.context() as env:
        # Fake credentials, and no shared config/credentials files, so nothing on this machine
        # (profiles, real keys, SSO) can leak into the tests or send them to real AWS.
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_SESSION_TOKEN", "testing")
        env.setenv("AWS_DEFAULT_REGION", REGION)
        env.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
        env.delenv("AWS_PROFILE", raising=False)
        env.delenv("AWS_ENDPOINT_URL", raising=False)
        env.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture(scope="session")
def boto_session(s3_endpoint: str) -> boto3.session.Session:
    """One boto3 session for all tests: loading service models per client costs ~0.1 s."""
    return boto3.session.Session(region_name=REGION)


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str, boto_session: boto3.session.Session) -> Iterator[Any]:
    """A raw boto3 S3 client on the moto server, to look behind the store's back."""
    client = boto_session.client("s3", endpoint_url=s3_endpoint)
    yield client
    client.close()


@pytest.fixture(scope="session")
def kms_client(s3_endpoint: str, boto_session: boto3.session.Session) -> Iterator[Any]:
    """A raw boto3 KMS client on the same moto server (moto serves every service on one port)."""
    client = boto_session.client("kms", endpoint_url=s3_endpoint)
    yield client
    client.close()


@pytest.fixture
def bucket(s3_client: Any) -> str:
    """A fresh, empty bucket for one test."""
    name = f"transcripts-{uuid.uuid4().hex}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def slack_api() -> Iterator[FakeSlackAPI]:
    """The fake Slack Web API on loopback (`url` is the client's base URL)."""
    with FakeSlackAPI() as api:
        yield api


@pytest.fixture
async def sink() -> AsyncIterator[SmtpSink]:
    """An SMTP server on loopback that keeps what it receives."""
    server = SmtpSink()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def fake_api() -> Iterator[FakeAnthropicAPI]:
    """The fake Anthropic Messages API on loopback (the SDK's `base_url`)."""
    with FakeAnthropicAPI() as api:
        yield api
