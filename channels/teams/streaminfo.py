"""What a Teams stream looks like on the wire, and the handle that finds it again.

Teams streams a bot's answer in personal chats with `typing` activities carrying a
`streaminfo` entity (`streamType` informative or streaming, `streamSequence` 1, 2, 3 …, and
from the second request on the `streamId`, which is the id the connector returned for the
first), and ends it with a `message` activity whose entity says `final` (with the `streamId`,
without a sequence). botbuilder's `Entity` serialises only `type` and silently drops any other
field (botbuilder-python #2231), so `StreamInfoEntity` declares the stream fields itself.

A stream lives at most two minutes on Teams' side; `StreamHandle.started_at` lets any process
tell whether the final message can still finish it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

from botbuilder.schema import (  # type: ignore[import-untyped]  # (untyped SDK)
    Activity,
    ActivityTypes,
    Entity,
    TextFormatTypes,
)

StreamType = Literal["informative", "streaming", "final"]

STREAM_LIMIT = timedelta(minutes=2)  # Teams ends a stream this long after it started
UPDATES_UNTIL = timedelta(seconds=100)  # no updates after this: the final needs its room
FINAL_UNTIL = timedelta(seconds=110)  # a final later than this may arrive too late
INFORMATIVE_MAX_CHARS = 1000  # Teams refuses longer informative updates


class StreamInfoEntity(Entity):  # type: ignore[misc]  # (untyped SDK base class)
    """The `streaminfo` entity with the fields that botbuilder's `Entity` would drop."""

    _attribute_map: ClassVar[dict[str, dict[str, str]]] = {
        "type": {"key": "type", "type": "str"},
        "stream_id": {"key": "streamId", "type": "str"},
        "stream_type": {"key": "streamType", "type": "str"},
        "stream_sequence": {"key": "streamSequence", "type": "int"},
    }

    def __init__(
        self,
        *,
        stream_type: StreamType,
        stream_id: str | None = None,
        stream_sequence: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(type="streaminfo", **kwargs)
        self.stream_id = stream_id
        self.stream_type = stream_type
        self.stream_sequence = stream_sequence


def stream_update(
    text: str, *, stream_type: StreamType, sequence: int, stream_id: str | None
) -> Activity:
    """A `typing` activity that starts (no `stream_id` yet) or continues a stream."""
    return Activity(
        type=ActivityTypes.typing,
        text=text,
        entities=[
            StreamInfoEntity(stream_type=stream_type, stream_id=stream_id, stream_sequence=sequence)
        ],
    )


def stream_final(text: str, *, stream_id: str) -> Activity:
    """The `message` activity that ends the stream with the whole answer (Markdown)."""
    return Activity(
        type=ActivityTypes.message,
        text=text,
        text_format=TextFormatTypes.markdown,
        entities=[StreamInfoEntity(stream_type="final", stream_id=stream_id)],
    )


@dataclass(frozen=True, slots=True)
class StreamHandle:
    """A stream as the gateway stores it (JSON): its id, its chat and when it started."""

    stream_id: str
    conversation_id: str
    started_at: datetime

    def as_json(self) -> dict[str, Any]:
        """The handle in the reply's `reply_context` and with the inbound event."""
        return {
            "stream_id": self.stream_id,
            "conversation_id": self.conversation_id,
            "started_at": self.started_at.isoformat(),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StreamHandle | None:
        """The handle stored by `as_json`, or None when it is not one (then nothing is
        finished: the reply goes out as a plain message)."""
        stream_id, conversation_id = value.get("stream_id"), value.get("conversation_id")
        started_at = value.get("started_at")
        if not all(isinstance(item, str) and item for item in (stream_id, conversation_id)):
            return None
        try:
            started = datetime.fromisoformat(started_at) if isinstance(started_at, str) else None
        except ValueError:
            return None
        if started is None or started.tzinfo is None:
            return None
        return cls(str(stream_id), str(conversation_id), started)

    def age(self, now: datetime) -> timedelta:
        """How long ago the stream started."""
        return now - self.started_at
