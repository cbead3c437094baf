"""Fixtures of the session tests: the fake Messages API on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.anthropic_api import FakeAnthropicAPI


@pytest.fixture
def api() -> Iterator[FakeAnthropicAPI]:
    """The fake Messages API (`url` is the client's base URL)."""
    with FakeAnthropicAPI() as fake:
        yield fake
