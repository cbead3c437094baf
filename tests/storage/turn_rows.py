"""A turn's rows as `storage.turn_store.send_turn` takes them, for tests: alice's web turn
(her messages' texts, each answered "ok") and its reply."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from storage.models import InboundStatus
from storage.repositories.outbox import reply_row
from storage.turn_store import ChannelUse, MessageToStore, TurnRows


def web_turn(
    session_id: str,
    texts: Sequence[str],
    *,
    after_seq: int,
    event_id: int,
    reply_id: str,
    at: datetime,
    reply_session: str | None = None,
) -> TurnRows:
    """The messages `texts` (the user's, then the answers "ok"), numbered after `after_seq`,
    finishing event `event_id` with a reply `reply_id` (of `reply_session`: the turn's own
    session unless given)."""
    messages = [
        MessageToStore("user" if n == 0 else "assistant", "web", text, 1)
        for n, text in enumerate(texts)
    ]
    return TurnRows(
        session_id,
        messages,
        after_seq=after_seq,
        usage=None,
        channel=ChannelUse("web", "alice"),
        event_id=event_id,
        status=InboundStatus.DONE,
        user_id="alice",
        reply=reply_row(
            message_id=reply_id,
            channel_type="web",
            channel_id="alice",
            content="ok",
            at=at,
            user_id="alice",
            session_id=reply_session or session_id,
            inbound_event_id=event_id,
        ),
    )
