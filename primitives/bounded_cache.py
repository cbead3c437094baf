"""`BoundedCache`: an in-process cache that cannot grow without limit.

Every cache the gateway keeps between requests (senders, threads, Slack names, Bot Connector
clients, sessions' histories) is one of these. Two bounds apply:

- size: the total weight of the entries stays within `max_weight`; each entry weighs 1 unless
  a `weigh` function says otherwise (a cache of lists can then be bounded by the items it
  holds rather than by the number of lists). Beyond it the least recently used entries go
  first, so a full cache keeps what is in use instead of starting again from nothing.
- age, optionally: with a `ttl`, an entry is forgotten `ttl` seconds after it was stored
  (reading it does not make it younger), for values that may change elsewhere.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")


def _one(_value: object) -> int:
    return 1


class BoundedCache(Generic[K, V]):
    """A mapping that forgets its least recently used entries beyond `max_weight` and, with
    a `ttl`, entries stored more than `ttl` seconds ago (measured by `clock`).

    A single entry heavier than `max_weight` is still kept, alone: the value a caller just
    stored is never the one dropped.
    """

    def __init__(
        self,
        max_weight: int,
        *,
        weigh: Callable[[V], int] = _one,
        ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_weight < 1:
            raise ValueError(f"max_weight must be at least 1, not {max_weight}")
        if ttl is not None and ttl < 0:
            raise ValueError(f"ttl must not be negative, not {ttl}")
        self.max_weight = max_weight
        self.ttl = ttl
        self._weigh = weigh
        self._clock = clock
        self._weight = 0
        # Least recently used first; each value with its weight.
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        # With a ttl: when each entry was stored, oldest first, so expiring stops at the
        # first fresh one instead of looking at every entry.
        self._stored_at: OrderedDict[K, float] = OrderedDict()

    @property
    def weight(self) -> int:
        """The total weight of the entries held."""
        self._expire()
        return self._weight

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether `key` has a fresh entry (without making it the most recently used)."""
        self._expire()
        return key in self._entries

    @overload
    def get(self, key: K) -> V | None: ...

    @overload
    def get(self, key: K, default: D) -> V | D: ...

    def get(self, key: K, default: D | None = None) -> V | D | None:
        """The entry (now the most recently used), or `default`."""
        self._expire()
        found = self._entries.get(key)
        if found is None:
            return default
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: K, value: V) -> None:
        """Store `value` (replacing any entry of `key`), then drop the least recently used
        entries over the bound."""
        weight = self._weigh(value)
        if weight < 0:
            raise ValueError(f"an entry's weight must not be negative, not {weight}")
        self._expire()
        self._remove(key)
        self._entries[key] = (value, weight)
        self._weight += weight
        if self.ttl is not None:
            self._stored_at[key] = self._clock()
        while self._weight > self.max_weight and len(self._entries) > 1:
            oldest = next(iter(self._entries))
            self._remove(oldest)

    @overload
    def pop(self, key: K) -> V | None: ...

    @overload
    def pop(self, key: K, default: D) -> V | D: ...

    def pop(self, key: K, default: D | None = None) -> V | D | None:
        """Remove and return the fresh entry of `key`, or `default`."""
        self._expire()
        found = self._remove(key)
        return default if found is None else found[0]

    def clear(self) -> None:
        """Forget everything."""
        self._entries.clear()
        self._stored_at.clear()
        self._weight = 0

    def _remove(self, key: K) -> tuple[V, int] | None:
        found = self._entries.pop(key, None)
        if found is not None:
            self._weight -= found[1]
            self._stored_at.pop(key, None)
        return found

    def _expire(self) -> None:
        if self.ttl is None or not self._stored_at:
            return
        now = self._clock()
        while self._stored_at:
            key, stored_at = next(iter(self._stored_at.items()))
            if now - stored_at < self.ttl:
                return
            self._remove(key)
