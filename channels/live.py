"""Live replies: an answer shown on the platform while the assistant writes it.

A channel that can show progress implements `LiveChannel` on its adapter. For each turn the
gateway asks it for a `LiveReply` (`live_reply`), then drives that object from the turn's
progress: a status line while the assistant works, the answer's text so far as it grows, and
`close` once the reply is committed. The gateway calls a `LiveReply`'s methods one at a time
(never concurrently), throttled to the channel's `live_interval`, and never after the reply
was handed to the outbox.

Exactly once: the live message *is* the turn's one reply. As soon as the platform message
exists, `LiveReply.handle` says how to find it again (JSON values); the gateway stores the
handle with the inbound message (so a restart finishes that message instead of posting a
second one) and puts it into the committed reply's `reply_context[LIVE_KEY]`. The adapter's
`send` then *finishes* that message with the reply's full text (the text shown while
streaming is only a preview: the committed text is authoritative, even when they differ), and
must stay idempotent across retries and restarts. A reply without a handle is sent as usual.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from channels.base import Conversation, OutboundMessage

LIVE_KEY = "live"
"""The key of a reply's `reply_context` holding the handle of its live platform message."""


class LiveStoppedError(Exception):
    """The user stopped the answer (Teams' Stop button): show nothing more of it."""


@dataclass(frozen=True, slots=True)
class ReplyTarget:
    """Where a turn's live reply goes: the inbound message's reply address."""

    channel_id: str
    thread_id: str
    # The inbound message's `reply_context` (as the channel's parser made it).
    reply_context: Mapping[str, Any]
    # The gateway's user id (the web channel's feed is per user) and the user's own id on
    # the platform (Slack's recipient_user_id).
    user_id: str
    user_identifier: str
    # The inbound message's id (the reply's `in_reply_to`).
    in_reply_to: str
    conversation: Conversation = Conversation.DIRECT
    extra: Mapping[str, Any] = field(default_factory=dict)


class LiveReply(Protocol):
    """One answer shown while it is written, on (at most) one platform message.

    Platform failures raise `DeliveryError` (with `retry_after` for rate limits): the gateway
    then pauses or stops the live updates, and the final `send` still delivers the answer.
    """

    @property
    def handle(self) -> Mapping[str, Any] | None:
        """How to find the platform message being written (JSON values), once one exists."""
        ...

    async def status(self, text: str) -> None:
        """Show that the assistant is working ("Searching earlier conversations…")."""
        ...

    async def text(self, text: str) -> None:
        """Show the answer so far: the whole text, cumulative (send what is new, or replace).
        Raise `LiveStoppedError` when the user stopped the answer."""
        ...

    async def close(self, *, committed: bool) -> None:
        """The turn is over: its reply is committed (`committed`) or there is none. Clear
        indicators that the final message does not clear by itself; failures are logged here,
        never raised."""
        ...


@runtime_checkable
class LiveChannel(Protocol):
    """An adapter that can show replies while they are written."""

    # Seconds between two text updates of one answer (the platform's pace).
    live_interval: float

    def live_reply(
        self, target: ReplyTarget, *, resume: Mapping[str, Any] | None = None
    ) -> LiveReply | None:
        """A live reply for this turn, or None when the conversation gets none (streaming
        off for the channel, or the platform cannot show it there).

        `resume` is the handle a previous attempt at the same message stored (the process
        died mid-stream): the live reply must not create a second platform message; it may
        show status, and `send` finishes the stored message.
        """
        ...


def live_handle(message: OutboundMessage) -> Mapping[str, Any] | None:
    """The live platform message a reply finishes, if it was streamed."""
    handle = message.reply_context.get(LIVE_KEY)
    return handle if isinstance(handle, Mapping) else None


@runtime_checkable
class TitledChannel(Protocol):
    """An adapter that can name a conversation's thread (Slack's assistant threads)."""

    async def set_title(self, target: ReplyTarget, title: str) -> None:
        """Name the thread the target is in after the conversation's topic; failures are
        logged here, never raised (a title is a courtesy)."""
        ...
