"""`SingleFlight`: at most one run per key, and one more when asked while it runs.

Work such as "drain this user's queue" must not run twice at once for the same key, yet a
request that arrives while a run is under way must not be lost: the run may already have
looked at what the request is about. Requests during a run therefore collapse into a single
further run, started once the current one ends.

The caller owns the runs (it creates the tasks); this class only keeps the book:

    if flights.begin(key):
        start_run(key)            # no run was in progress: this is it
    ...
    # when the run ends (in a `finally`):
    if flights.end(key):
        request_again(key)        # asked for while it ran: `begin` once more

It is meant for one event loop (or one thread): `begin` and `end` do not wait, so nothing
else runs between a check and its update.
"""

from __future__ import annotations


class SingleFlight:
    """Which keys have a run in progress, and which were asked to run again meanwhile."""

    def __init__(self) -> None:
        self._running: set[str] = set()
        self._again: set[str] = set()

    def begin(self, key: str) -> bool:
        """Ask for a run of `key`. True: none was in progress and the caller must start it
        now (it counts as running from here). False: one is in progress; it will be followed
        by one more, however many times this is asked meanwhile."""
        if key in self._running:
            self._again.add(key)
            return False
        self._running.add(key)
        return True

    def end(self, key: str) -> bool:
        """Record that the run of `key` ended; True when another was asked for while it ran
        (the caller then asks again with `begin`, or lets it go, say when shutting down)."""
        if key not in self._running:
            raise KeyError(f"no run of {key!r} is in progress")
        self._running.discard(key)
        if key in self._again:
            self._again.discard(key)
            return True
        return False

    def is_running(self, key: str) -> bool:
        """Whether a run of `key` is in progress."""
        return key in self._running

    def rerun_requested(self, key: str) -> bool:
        """Whether another run of `key` was asked for while the current one runs."""
        return key in self._again
