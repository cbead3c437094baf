"""Mail the assistant must not answer, and how often it answers one sender.

Answering a bounce, an auto-responder, a mailing list or ourselves starts a mail loop, so such
mail is accepted (a refusal would itself bounce) but never routed (`unanswerable_reason`).
`SenderRateLimit` caps how many mails per sender are routed an hour, and therefore how many
replies a sender (or a loop we did not recognise) can draw.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from email.message import Message

from channels.email import headers

_DAEMONS = frozenset({"mailer-daemon", "mail-daemon", "mailerdaemon", "noreply-dmarc-support"})
_BULK = frozenset({"bulk", "list", "junk"})
MAX_TRACKED_SENDERS = 10_000


def unanswerable_reason(message: Message, *, mail_from: str, ours: Iterable[str]) -> str | None:
    """Why the assistant must not answer `message` (None when it may): a bounce (empty
    envelope sender, a mailer-daemon), an automatic message (``Auto-Submitted``), bulk or list
    mail (``Precedence``), or mail from one of our own addresses."""
    if not mail_from.strip("<> "):
        return "null envelope sender (a bounce or notification)"
    sender = headers.sender(message)
    addresses = {mail_from.strip("<> ").lower()}
    if sender is not None:
        addresses.add(sender[0].lower())
    if any(address.partition("@")[0] in _DAEMONS for address in addresses):
        return "sent by a mailer daemon"
    if addresses & {address.lower() for address in ours}:
        return "sent from our own address"
    auto = headers.raw(message, "Auto-Submitted").split(";")[0].strip().lower()
    if auto and auto != "no":
        return f"Auto-Submitted: {auto}"
    precedence = headers.raw(message, "Precedence").strip().lower()
    if precedence in _BULK:
        return f"Precedence: {precedence}"
    return None


class SenderRateLimit:
    """At most `per_hour` routed mails per sender in any hour (a sliding window)."""

    def __init__(self, per_hour: int, *, clock: Callable[[], datetime]) -> None:
        self.per_hour = per_hour
        self.clock = clock
        self._seen: OrderedDict[str, deque[datetime]] = OrderedDict()

    def allows(self, sender: str) -> bool:
        """Whether another mail from `sender` may be routed now."""
        if self.per_hour <= 0:
            return True
        return len(self._recent(sender.lower())) < self.per_hour

    def record(self, sender: str) -> None:
        """Count a routed mail from `sender`."""
        recent = self._recent(sender.lower())
        recent.append(self.clock())
        self._seen[sender.lower()] = recent
        self._seen.move_to_end(sender.lower())
        while len(self._seen) > MAX_TRACKED_SENDERS:
            self._seen.popitem(last=False)

    def _recent(self, sender: str) -> deque[datetime]:
        times = self._seen.get(sender, deque())
        horizon = self.clock() - timedelta(hours=1)
        while times and times[0] <= horizon:
            times.popleft()
        return times
