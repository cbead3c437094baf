"""Waking turn workers: the accepting process says whose queue grew (PostgreSQL NOTIFY).

With `server.turn_workers`, one process accepts messages and others run the turns. A worker
finds all pending work by polling the inbox (once a second), which also recovers what a
crashed process left; a notification makes it start a user's turn at once instead. The
accepting process's INSERT of the messages committed together notifies their senders in the
same statement (`storage.repositories.inbox.accept_events` with `announce`): PostgreSQL
delivers it when the rows are committed, and it costs no statement or connection of its own.
Each worker keeps one connection listening (`inbox_listener`, a
`storage.notifications.Listener`).

A lost notification (a worker reconnecting) costs at most the poll interval, never a message:
the inbox row is the record, the notification only a hint.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import URL

from storage.notifications import Listener

CHANNEL = "gateway_inbox"
"""The notification channel; a notification's payload is senders' keys, one per line."""


def inbox_listener(url: URL, on_sender: Callable[[str | None], None]) -> Listener:
    """Calls `on_sender(sender)` for every sender the accepting process announces, and
    `on_sender(None)` after (re)connecting, when announcements may have been missed."""
    return Listener(url, CHANNEL, on_sender)
