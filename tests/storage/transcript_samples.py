"""Transcript lines for the transcript store's tests: one session's reference, numbered
lines whose role, thread and time follow from their number, and turns of a fixed size."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from storage.transcripts import SessionRef, TranscriptLine, transcript_segment_key

REF = SessionRef("acme", "alice", "s1")
T0 = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def line(n: int, content: str | None = None) -> TranscriptLine:
    """Line `n`: odd numbers are the user's, every third one is in a thread."""
    return TranscriptLine(
        msg_id=f"m{n}",
        role="user" if n % 2 else "assistant",
        channel="slack",
        thread_id=None if n % 3 else f"t{n}",
        content=content if content is not None else f"message {n}",
        timestamp=T0 + timedelta(seconds=n),
        tokens=n,
    )


def turn(first_seq: int) -> list[TranscriptLine]:
    """A turn as the gateway appends it: the user's message and the answer, the same size
    whatever their sequence numbers, so two turns' bytes can be compared."""
    return [
        TranscriptLine(
            msg_id=f"m{seq:010d}",
            role=role,
            channel="web",
            thread_id=None,
            content="x" * 200,
            timestamp=T0,
            tokens=50,
        )
        for seq, role in [(first_seq, "user"), (first_seq + 1, "assistant")]
    ]


def segment(ref: SessionRef, first_seq: int) -> str:
    """The key of the session's segment that starts at `first_seq`."""
    return transcript_segment_key(ref, first_seq)
