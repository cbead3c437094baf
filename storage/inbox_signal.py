"""Waking turn workers: the accepting process says whose queue grew (PostgreSQL NOTIFY).

With `server.turn_workers`, one process accepts messages and others run the turns. A worker
finds all pending work by polling the inbox (once a second), which also recovers what a
crashed process left; a notification makes it start a user's turn at once instead. The
accepting process's INSERT of the messages committed together notifies their senders in the
same statement (`storage.repositories.inbox.accept_events` with `announce`): PostgreSQL
delivers it when the rows are committed, and it costs no statement or connection of its own.
Each worker keeps one connection listening (`inbox_listener`, a
`storage.notifications.Listener`).

Each sender belongs to one worker's share (`share_of`, a hash of the sender's key): it is
announced on that worker's channel only, and the other workers' polls leave its events to
that worker until they have waited `TAKEOVER_AFTER` (its worker is stopped, restarting or
behind). Told of every sender, every worker tried every user's turn lock and read their queue
or history with it, and all but one for nothing, so that two workers cost more a message
than one process (`bench/README.md`); a user's turns also run in one process, whose caches
keep their history and memory.

A lost notification (a worker reconnecting) costs at most the poll interval, never a message:
the inbox row is the record, the notification only a hint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.engine import URL

from storage.notifications import Listener

CHANNEL = "gateway_inbox"
"""The notification channels' prefix: worker N's channel is `gateway_inbox_N`; a
notification's payload is senders' keys, one per line."""

TAKEOVER_AFTER = timedelta(seconds=10)
"""How long a sender's oldest pending event waits for its own worker before any worker's poll
takes it (a worker that exits is restarted after a second or more)."""


@dataclass(frozen=True, slots=True)
class WorkerShare:
    """Which of `count` turn workers this is (`index` from 0)."""

    index: int
    count: int

    @classmethod
    def configured(cls, index: int, turn_workers: int) -> WorkerShare:
        """Worker `index` of `server.turn_workers` (of one when the setting is 0: a process
        that runs every turn itself); `ValueError` when the index is not one of them."""
        return cls(index, max(turn_workers, 1))

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"worker {self.index} is not one of 0 to {self.count - 1}")

    @property
    def channel(self) -> str:
        """The channel this worker's senders are announced on."""
        return share_channel(self.index)


def share_channel(index: int) -> str:
    """The notification channel of worker `index`."""
    return f"{CHANNEL}_{index}"


def share_of(column: str, count: int) -> str:
    """SQL: the index of the worker (of `count`) whose share the sender key in `column` is.
    The statement that announces and the workers' polls compute it on the same server
    (PostgreSQL's `hashtext`), so they agree."""
    return f"mod(hashtext({column})::bigint + 2147483648, {int(count)})"


def inbox_listener(
    url: URL, on_sender: Callable[[str | None], None], share: WorkerShare
) -> Listener:
    """Calls `on_sender(sender)` for every sender of the worker's share the accepting process
    announces, and `on_sender(None)` after (re)connecting, when announcements may have been
    missed."""
    return Listener(url, share.channel, on_sender)
