"""Fixtures the storage tests share: an S3 transcript store on the test bucket (moto over
HTTP, from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from storage.s3_transcripts import S3TranscriptStore


@pytest.fixture
async def s3_store(
    s3_endpoint: str, boto_session: Any, bucket: str
) -> AsyncIterator[S3TranscriptStore]:
    store = S3TranscriptStore(bucket, endpoint_url=s3_endpoint, boto_session=boto_session)
    yield store
    await store.close()
