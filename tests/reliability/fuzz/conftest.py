"""The fixture every fuzz module shares: the event loop its gateways run in."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from gateway import outbox
from tests.reliability.fuzz.harness import LoopThread


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    with pytest.MonkeyPatch.context() as patch:
        # The outbox's retry jitter draws from the global random generator, which hypothesis
        # watches while it generates examples in the test's thread: give it a generator of its
        # own, or a retry in the gateway's thread makes a draw look non-deterministic.
        patch.setattr(outbox, "random", random.Random(0))
        thread = LoopThread()
        yield thread
        thread.close()
