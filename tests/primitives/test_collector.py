"""The collector settings of a serving process: start-up's objects frozen, passes spaced."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from primitives.collector import YOUNG_THRESHOLD, settle_after_start


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_collector")
def test_settling_freezes_what_start_up_allocated_and_spaces_young_passes() -> None:
    gc.unfreeze()
    kept_from_start_up = [[] for _ in range(1000)]  # lists: objects the collector tracks
    settle_after_start()
    assert gc.get_freeze_count() >= len(kept_from_start_up)
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
