"""A `TurnProgress` that records what a turn told it, with when (`time.monotonic()`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sessions.progress import StatusKind


@dataclass(frozen=True, slots=True)
class ProgressCall:
    """One call: `status` (with kind and detail), `text` (with the delta) or `reset`."""

    method: str
    value: str = ""
    detail: str = ""
    at: float = 0.0


class RecordedProgress:
    """Records every call in order; `settle` names no live message."""

    def __init__(self) -> None:
        self.calls: list[ProgressCall] = []

    def status(self, kind: StatusKind, detail: str = "") -> None:
        """Record the status."""
        self.calls.append(ProgressCall("status", kind, detail, time.monotonic()))

    def text(self, delta: str) -> None:
        """Record the delta."""
        self.calls.append(ProgressCall("text", delta, at=time.monotonic()))

    def reset(self) -> None:
        """Record the reset."""
        self.calls.append(ProgressCall("reset", at=time.monotonic()))

    async def settle(self) -> Mapping[str, Any] | None:
        """No live message."""
        return None

    @property
    def deltas(self) -> list[str]:
        """The text deltas, in order."""
        return [call.value for call in self.calls if call.method == "text"]

    def shown(self) -> str:
        """The text a watcher would show now: what came after the last reset."""
        text = ""
        for call in self.calls:
            if call.method == "reset":
                text = ""
            elif call.method == "text":
                text += call.value
        return text

    def outline(self) -> list[str]:
        """The calls with consecutive text deltas folded into one "text" entry, statuses as
        "status:kind" (or "status:kind:detail"): the shape of a turn."""
        shape: list[str] = []
        for call in self.calls:
            if call.method == "status":
                shape.append(":".join(filter(None, ("status", call.value, call.detail))))
            elif call.method == "reset":
                shape.append("reset")
            elif not shape or shape[-1] != "text":
                shape.append("text")
        return shape
