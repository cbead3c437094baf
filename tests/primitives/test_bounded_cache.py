"""The bounded cache: least recently used entries go first once the entries' weight exceeds
the bound, and with a ttl an entry is forgotten that many seconds after it was stored."""

from __future__ import annotations

import pytest

from primitives.bounded_cache import BoundedCache


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_least_recently_stored_entry_goes_first_beyond_the_bound() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert ("a" in cache, "b" in cache, "c" in cache) == (False, True, True)
    assert len(cache) == 2


def test_reading_an_entry_makes_it_the_most_recently_used() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)


def test_storing_again_replaces_the_value_and_makes_it_the_most_recently_used() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (10, None, 3)
    assert len(cache) == 2


def test_asking_whether_a_key_is_held_does_not_make_it_recently_used() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert "a" in cache
    cache.put("c", 3)
    assert "a" not in cache
    assert "b" in cache


def test_entries_are_bounded_by_their_weight_not_their_number() -> None:
    cache: BoundedCache[str, list[int]] = BoundedCache(5, weigh=len)
    cache.put("a", [1, 2])
    cache.put("b", [1, 2])
    assert cache.get("a") == [1, 2]  # now the most recently used
    cache.put("c", [1, 2])
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == ([1, 2], None, [1, 2])
    assert cache.weight == 4


def test_a_heavy_entry_drops_as_many_light_ones_as_it_needs() -> None:
    cache: BoundedCache[str, list[int]] = BoundedCache(5, weigh=len)
    for key in "abcde":
        cache.put(key, [0])
    cache.put("big", [0, 0, 0])
    assert [key for key in "abcde" if key in cache] == ["d", "e"]
    assert cache.weight == 5


def test_an_entry_heavier_than_the_bound_is_kept_alone() -> None:
    cache: BoundedCache[str, list[int]] = BoundedCache(3, weigh=len)
    cache.put("a", [0])
    cache.put("huge", [0] * 10)
    assert (cache.get("a"), cache.get("huge")) == (None, [0] * 10)
    assert (len(cache), cache.weight) == (1, 10)


def test_replacing_an_entry_counts_only_its_new_weight() -> None:
    cache: BoundedCache[str, list[int]] = BoundedCache(10, weigh=len)
    cache.put("a", [0, 0, 0])
    cache.put("a", [0])
    assert cache.weight == 1


def test_pop_removes_the_entry_and_its_weight() -> None:
    cache: BoundedCache[str, list[int]] = BoundedCache(10, weigh=len)
    cache.put("a", [0, 0])
    assert cache.pop("a") == [0, 0]
    assert cache.pop("a") is None
    assert cache.pop("a", []) == []
    assert ("a" in cache, len(cache), cache.weight) == (False, 0, 0)


def test_clear_forgets_everything() -> None:
    cache: BoundedCache[str, int] = BoundedCache(10)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.clear()
    assert (len(cache), cache.weight, cache.get("a")) == (0, 0, None)


def test_a_default_tells_a_missing_entry_from_a_stored_none() -> None:
    cache: BoundedCache[str, int | None] = BoundedCache(10)
    cache.put("none", None)
    missing = object()
    assert cache.get("none", missing) is None
    assert cache.get("other", missing) is missing
    assert "none" in cache


def test_an_entry_expires_ttl_seconds_after_it_was_stored() -> None:
    clock = FakeClock()
    cache: BoundedCache[str, int] = BoundedCache(10, ttl=30.0, clock=clock)
    cache.put("a", 1)
    clock.now += 29.9
    assert cache.get("a") == 1
    clock.now += 0.1
    assert cache.get("a") is None
    assert ("a" in cache, len(cache), cache.weight) == (False, 0, 0)


def test_reading_an_entry_does_not_extend_its_life() -> None:
    clock = FakeClock()
    cache: BoundedCache[str, int] = BoundedCache(10, ttl=30.0, clock=clock)
    cache.put("a", 1)
    for _ in range(5):
        clock.now += 10.0
        cache.get("a")
    assert cache.get("a") is None


def test_storing_again_restarts_an_entrys_life() -> None:
    clock = FakeClock()
    cache: BoundedCache[str, int] = BoundedCache(10, ttl=30.0, clock=clock)
    cache.put("a", 1)
    clock.now += 20.0
    cache.put("a", 2)
    clock.now += 20.0
    assert cache.get("a") == 2


def test_only_the_expired_entries_go() -> None:
    clock = FakeClock()
    cache: BoundedCache[str, int] = BoundedCache(10, ttl=30.0, clock=clock)
    cache.put("old", 1)
    clock.now += 20.0
    cache.put("new", 2)
    assert cache.get("old") == 1  # most recently used now, but still the oldest stored
    clock.now += 15.0
    assert (cache.get("old"), cache.get("new"), len(cache)) == (None, 2, 1)


def test_expired_entries_free_their_weight_for_new_ones() -> None:
    clock = FakeClock()
    cache: BoundedCache[str, int] = BoundedCache(2, ttl=30.0, clock=clock)
    cache.put("a", 1)
    clock.now += 10.0
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    clock.now += 25.0  # "a" has expired, "b" has not
    cache.put("c", 3)
    assert (cache.get("b"), cache.get("c")) == (2, 3)


def test_an_expired_entry_cannot_be_popped() -> None:
    clock = FakeClock()
    cache: BoundedCache[str, int] = BoundedCache(10, ttl=1.0, clock=clock)
    cache.put("a", 1)
    clock.now += 1.0
    assert cache.pop("a") is None


def test_a_zero_ttl_keeps_nothing() -> None:
    clock = FakeClock()
    cache: BoundedCache[str, int] = BoundedCache(10, ttl=0.0, clock=clock)
    cache.put("a", 1)
    assert cache.get("a") is None


def test_without_a_ttl_entries_never_expire() -> None:
    clock = FakeClock()
    cache: BoundedCache[str, int] = BoundedCache(10, clock=clock)
    cache.put("a", 1)
    clock.now += 1e9
    assert cache.get("a") == 1


@pytest.mark.parametrize(
    ("max_weight", "ttl"),
    [(0, None), (-1, None), (1, -0.5)],
)
def test_a_bound_below_one_or_a_negative_ttl_is_refused(max_weight: int, ttl: float | None) -> None:
    with pytest.raises(ValueError, match="must"):
        BoundedCache[str, int](max_weight, ttl=ttl)


def test_a_negative_weight_is_refused_and_nothing_is_stored() -> None:
    cache: BoundedCache[str, int] = BoundedCache(10, weigh=lambda value: value)
    with pytest.raises(ValueError, match="negative"):
        cache.put("a", -1)
    assert ("a" in cache, cache.weight) == (False, 0)
