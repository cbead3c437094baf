"""Fixtures for the storage tests: a real S3-compatible server (moto) over HTTP on loopback."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

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
