"""What crosses between the gateway and the session layer's turn: the user's message to
answer (`UserTurn`), where its reply goes (`ReplyAddress`) and what the committed turn produced
(`TurnResult`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from errors import StorageError
from sessions.files.turn_files import IncomingFile
from sessions.routing import Arrival
from storage.repositories.outbox import QueuedReply
from storage.repositories.session_state import CurrentSessions
from storage.transcripts import TranscriptLine

LIVE_REPLY_KEY = "live"
"""The reply context key of the live platform message a streamed reply finishes (the
channels' `channels.live.LIVE_KEY`: the gateway checks the two agree)."""


LLM_APOLOGY_TEXT = (
    "Sorry, I could not get an answer from the assistant just now. "
    "Your message is saved; please try again in a moment."
)


class TurnSupersededError(StorageError):
    """The inbound event was finished by someone else while this turn ran (nothing stored)."""


@dataclass(frozen=True, slots=True)
class ReplyAddress:
    """Where the reply goes; the gateway's outbox reads it, the turn only stores it."""

    channel_type: str
    channel_id: str
    thread_id: str = ""
    reply_context: Mapping[str, Any] = field(default_factory=dict)
    # Pull channels (the web feed): being stored is being delivered; nothing to send.
    delivered_on_store: bool = False


@dataclass(frozen=True, slots=True)
class UserTurn:
    """A user's message to answer, as the session layer sees it."""

    event_id: int
    arrival: Arrival
    message_id: str
    text: str
    reply_to: ReplyAddress
    # Stored with the user's message (the channel id, forwarded headers, attachment names).
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # Resume by reference may look up an archived session the text continues.
    may_resume_by_reference: bool = True
    # The files that came with the message (their bytes, or why the gateway has none).
    files: tuple[IncomingFile, ...] = ()
    # The user's current sessions as they were read just before the turn, under its lock
    # (None: not read; the turn routes by its own reads).
    current: CurrentSessions | None = None


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What a committed turn produced."""

    session_id: str
    org_id: str
    user_id: str
    first_seq: int
    last_seq: int
    reply_text: str
    # The committed reply, claimed for this process to send (None on a pull channel).
    outbound: QueuedReply | None
    answered: bool  # False: the model failed and the reply is the apology
    compacted: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    transcript: tuple[TranscriptLine, ...] = ()
    model_seconds: float = 0.0  # compaction, model and tools


def new_outbound_id() -> str:
    """Our own id for a reply."""
    return f"out-{uuid.uuid4().hex}"
