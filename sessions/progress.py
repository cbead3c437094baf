"""What a turn tells the world while it runs: status (what the assistant is doing) and the
answer's text as the model writes it.

The turn calls these synchronously and never waits on them (they only record); whoever shows
progress (the gateway's live replies) does its platform calls on its own task. `settle` is the
one await: before the turn commits its reply, the progress stops and says which live message,
if any, the reply must finish.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

StatusKind = Literal["thinking", "compacting", "searching", "reading", "tool"]
"""thinking: the model is working; compacting: older messages are being summarised;
searching: the earlier-conversations search runs; reading: a file is being read; tool: a tool
runs (`detail` names it)."""


class TurnProgress(Protocol):
    """Receives a turn's progress; every method but `settle` returns at once."""

    def status(self, kind: StatusKind, detail: str = "") -> None:
        """The assistant is now doing `kind` (`detail`: the tool's or file's name)."""
        ...

    def text(self, delta: str) -> None:
        """More of the answer's text, as the model wrote it."""
        ...

    def reset(self) -> None:
        """The text so far is not the answer (the model called a tool; a retried call starts
        over): what comes next replaces it."""
        ...

    async def settle(self) -> Mapping[str, Any] | None:
        """Stop showing progress (waiting for an update in flight) before the reply is
        committed; the handle of the live message the reply finishes, if there is one."""
        ...


class NoProgress:
    """Progress nobody watches (email, commands, tests)."""

    def status(self, kind: StatusKind, detail: str = "") -> None:
        """Nothing to show."""

    def text(self, delta: str) -> None:
        """Nothing to show."""

    def reset(self) -> None:
        """Nothing to reset."""

    async def settle(self) -> Mapping[str, Any] | None:
        """No live message."""
        return None


NO_PROGRESS = NoProgress()
