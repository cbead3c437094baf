"""Users' memory changed: PostgreSQL tells every gateway process (NOTIFY).

The triggers of migration 0008 send a user's id on `CHANNEL` when a transaction that changed
their memory facts or session summaries commits, whoever wrote it (a summary job, compaction,
a deletion from the admin CLI or API, `/forget`, retention). Each process that runs turns
listens and drops its cached copy (`sessions.context_cache.MemoryCache.changed`); after
(re)connecting it drops them all, since changes may have been missed meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import URL

from storage.notifications import Listener

CHANNEL = "gateway_memory"


def memory_listener(
    url: URL, on_user: Callable[[str | None], None], on_lost: Callable[[], None]
) -> Listener:
    """Calls `on_user(user_id)` for every user whose memory changed in any process,
    `on_user(None)` after (re)connecting, and `on_lost()` when the connection is lost."""
    return Listener(url, CHANNEL, on_user, on_lost)
