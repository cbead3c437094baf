"""The HTTP shell: readiness follows the database, metrics count requests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import make_url

from gateway.app import create_app
from gateway.runtime import GatewayRuntime
from gateway.settings import GatewayConfig
from tests.conftest import POSTGRES_ADMIN_URL


def admin_connection() -> psycopg.Connection[tuple[object, ...]]:
    url = make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)


@pytest.fixture
async def postgres_runtime(tmp_path: Path) -> AsyncIterator[tuple[GatewayRuntime, str]]:
    name = f"gateway_ready_{uuid.uuid4().hex[:10]}"
    with admin_connection() as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    config = GatewayConfig.model_validate(
        {
            "storage": {
                "database_url": url,
                "transcripts": {"local_path": str(tmp_path / "transcripts")},
            }
        }
    )
    runtime = await GatewayRuntime.start(config)
    yield runtime, name
    await runtime.close()
    with admin_connection() as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_readiness_fails_with_a_reason_while_the_database_is_gone_and_recovers(
    postgres_runtime: tuple[GatewayRuntime, str],
) -> None:
    runtime, name = postgres_runtime
    transport = httpx.ASGITransport(app=create_app(runtime))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        assert (await client.get("/readyz")).status_code == 200

        with admin_connection() as connection:
            connection.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        response = await client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["status"] == "unavailable"
        assert name in response.json()["reason"]
        assert (await client.get("/healthz")).status_code == 200

        with admin_connection() as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        assert (await client.get("/readyz")).status_code == 200

        metrics = (await client.get("/metrics")).text
    assert 'gateway_http_requests_total{route="/readyz",status="503"} 1.0' in metrics
    assert 'gateway_http_requests_total{route="/readyz",status="200"} 2.0' in metrics
    assert 'gateway_http_request_duration_seconds_count{route="/healthz"} 1.0' in metrics
