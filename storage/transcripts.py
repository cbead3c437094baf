"""Transcript storage: the values, the key layout and the `TranscriptStore` protocol.

A session's transcript lives outside the database, in a folder or an S3 bucket, under keys
that are the same for every backend::

    sessions/{org_id}/{user_id}/{session_id}/transcript/{first_seq:010d}.jsonl
    sessions/{org_id}/{user_id}/{session_id}/transcript.jsonl      (legacy, read only)
    sessions/{org_id}/{user_id}/{session_id}/compact_001.json
    sessions/{org_id}/{user_id}/{session_id}/archive/full_transcript_pre_compact_001.jsonl
    sessions/{org_id}/{user_id}/{session_id}/files/{sha256}        (a file the user sent)
    incoming/{token}              (a file's bytes from acceptance until its turn stores them)

A transcript is append-only segments: each `append_lines` (one turn: the user's message and
the assistant's) writes one new object named by the session sequence number of its first line,
so an append costs the same for the 10,000th message as for the 10th (S3 has no append, and
rewriting one growing object costs the whole transcript every time). `read_transcript` returns
the legacy `transcript.jsonl` that earlier versions grew in place, if there is one, then the
segments in key order (ten digits keep key order and number order the same).

Compactions, pre-compact archives and files are immutable objects (`write_archive` never
overwrites).
This module owns those values and keys and the `TranscriptStore` protocol; the stores are
`storage.local_transcripts` (a folder) and `storage.s3_transcripts`. Neither store knows what
a compaction is: that is `sessions/`' job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from errors import StorageError

# A component becomes one path segment of a key; this alphabet cannot form a separator, a
# drive letter or a shell/URL metacharacter, so a key can never escape its prefix.
_COMPONENT = re.compile(r"[A-Za-z0-9._@+-]+")
_LINE_FIELDS = ("msg_id", "role", "channel", "thread_id", "content", "timestamp", "tokens")
_LEGACY_TRANSCRIPT = "transcript.jsonl"
_SEGMENTS = "transcript/"
_SEGMENT_NAME = re.compile(r"[0-9]{10}\.jsonl")
_SEGMENT_SEQ_LIMIT = 10**10  # ten digits: beyond this, key order would stop being seq order


def _check_component(name: str, value: str) -> None:
    if not isinstance(value, str) or not _COMPONENT.fullmatch(value) or value in {".", ".."}:
        raise StorageError(
            f"invalid {name} {value!r}: use 1+ characters of A-Z a-z 0-9 . _ @ + -, "
            "and not '.' or '..'"
        )


@dataclass(frozen=True, slots=True)
class SessionRef:
    """Identifies one session's folder; every component is checked so keys stay in their prefix."""

    org_id: str
    user_id: str
    session_id: str

    def __post_init__(self) -> None:
        _check_component("org_id", self.org_id)
        _check_component("user_id", self.user_id)
        _check_component("session_id", self.session_id)


@dataclass(frozen=True, slots=True)
class TranscriptLine:
    """One message of a transcript, stored as one JSON object per line of a segment."""

    msg_id: str
    role: str
    channel: str
    thread_id: str | None
    content: str
    timestamp: datetime
    tokens: int

    def __post_init__(self) -> None:
        # A naive timestamp would be written as if it were UTC and silently shift by the
        # server's offset; refuse it here instead of guessing.
        if self.timestamp.tzinfo is None or self.timestamp.utcoffset() is None:
            raise StorageError(f"transcript line {self.msg_id!r} has a naive timestamp")

    def to_json(self) -> str:
        """Return the line as one compact JSON object (no newline), timestamp in ISO-8601 UTC."""
        record = {
            "msg_id": self.msg_id,
            "role": self.role,
            "channel": self.channel,
            "thread_id": self.thread_id,
            "content": self.content,
            "timestamp": self.timestamp.astimezone(UTC).isoformat(),
            "tokens": self.tokens,
        }
        # ensure_ascii keeps U+2028/U+2029 escaped, so no line splitter can break a record.
        return json.dumps(record, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TranscriptLine:
        """Parse one line written by `to_json`; anything else raises `StorageError`."""
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StorageError(f"transcript line is not JSON: {exc}") from exc
        if not isinstance(record, dict) or set(record) != set(_LINE_FIELDS):
            raise StorageError(f"transcript line must have exactly the keys {_LINE_FIELDS}")
        strings = ("msg_id", "role", "channel", "content", "timestamp")
        bad = [name for name in strings if not isinstance(record[name], str)]
        if record["thread_id"] is not None and not isinstance(record["thread_id"], str):
            bad.append("thread_id")
        if isinstance(record["tokens"], bool) or not isinstance(record["tokens"], int):
            bad.append("tokens")
        if bad:
            raise StorageError(f"transcript line has fields of the wrong type: {bad}")
        try:
            timestamp = datetime.fromisoformat(record["timestamp"])
        except ValueError as exc:
            raise StorageError(f"transcript line has a bad timestamp: {exc}") from exc
        return cls(
            msg_id=record["msg_id"],
            role=record["role"],
            channel=record["channel"],
            thread_id=record["thread_id"],
            content=record["content"],
            timestamp=timestamp,
            tokens=record["tokens"],
        )


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object in a transcript store: its layout key (without any store prefix) and size."""

    key: str
    size: int


def encode_lines(lines: Sequence[TranscriptLine]) -> bytes:
    """Serialise lines as JSONL: one object per line, each ending in a newline."""
    return "".join(line.to_json() + "\n" for line in lines).encode("utf-8")


def parse_transcript(data: bytes) -> list[TranscriptLine]:
    """Parse a whole transcript (`read_transcript`), a segment or a pre-compact archive."""
    # Split on b"\n" rather than str.splitlines(), which also splits on characters JSON allows.
    return [TranscriptLine.from_json(raw.decode("utf-8")) for raw in data.split(b"\n") if raw]


def session_prefix(ref: SessionRef) -> str:
    """Return `sessions/{org}/{user}/{session}/`; the trailing slash keeps `s1` apart from `s10`."""
    return f"sessions/{ref.org_id}/{ref.user_id}/{ref.session_id}/"


def user_prefix(org_id: str, user_id: str) -> str:
    """Return `sessions/{org}/{user}/`, the prefix of all of one user's sessions."""
    _check_component("org_id", org_id)
    _check_component("user_id", user_id)
    return f"sessions/{org_id}/{user_id}/"


def legacy_transcript_key(ref: SessionRef) -> str:
    """Return the key of the `transcript.jsonl` that earlier versions grew in place.

    Nothing writes it any more; `read_transcript` reads it before the segments.
    """
    return session_prefix(ref) + _LEGACY_TRANSCRIPT


def transcript_segments_prefix(ref: SessionRef) -> str:
    """Return `sessions/{org}/{user}/{session}/transcript/`, the folder of the segments."""
    return session_prefix(ref) + _SEGMENTS


def transcript_segment_key(ref: SessionRef, first_seq: int) -> str:
    """Return the key of the segment whose first line has sequence number `first_seq` (>= 1)."""
    if (
        isinstance(first_seq, bool)
        or not isinstance(first_seq, int)
        or not 1 <= first_seq < _SEGMENT_SEQ_LIMIT
    ):
        raise StorageError(
            f"first_seq must be an integer from 1 to {_SEGMENT_SEQ_LIMIT - 1}, got {first_seq!r}"
        )
    return f"{transcript_segments_prefix(ref)}{first_seq:010d}.jsonl"


def transcript_keys(ref: SessionRef, keys: Iterable[str]) -> list[str]:
    """Pick the keys that make up the session's transcript out of `keys`, in reading order.

    The legacy `transcript.jsonl` comes first (it holds what was written before segments),
    then the segments in key order; every other key (archives, compactions, files, temporary
    or foreign names under `transcript/`) is left out.
    """
    listed = set(keys)
    legacy = legacy_transcript_key(ref)
    segments_prefix = transcript_segments_prefix(ref)
    segments = sorted(
        key
        for key in listed
        if key.startswith(segments_prefix)
        and _SEGMENT_NAME.fullmatch(key.removeprefix(segments_prefix))
    )
    return ([legacy] if legacy in listed else []) + segments


def join_transcript(parts: Iterable[bytes]) -> bytes:
    """Concatenate the legacy transcript and segments into one JSONL document."""
    # Every part written by this module ends in a newline; a legacy object cut short by a crash
    # mid-append may not, and gluing the next segment onto its torn line would spoil both.
    return b"".join(part if part.endswith(b"\n") else part + b"\n" for part in parts if part)


_SHA256 = re.compile(r"[0-9a-f]{64}")
INCOMING_PREFIX = "incoming/"


def _check_number(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise StorageError(f"compaction number must be an integer >= 1, got {n!r}")


def compaction_key(ref: SessionRef, n: int) -> str:
    """Return the key of the session's n-th compaction (`compact_001.json`, n >= 1)."""
    _check_number(n)
    return f"{session_prefix(ref)}compact_{n:03d}.json"


def pre_compact_archive_key(ref: SessionRef, n: int) -> str:
    """Return the key of the full transcript archived before the n-th compaction (n >= 1)."""
    _check_number(n)
    return f"{session_prefix(ref)}archive/full_transcript_pre_compact_{n:03d}.jsonl"


def session_file_key(ref: SessionRef, sha256: str) -> str:
    """Return the key of a file the user sent in the session, named by its SHA-256 (the same
    file sent twice in a session is stored once)."""
    if not _SHA256.fullmatch(sha256):
        raise StorageError("a file key needs a SHA-256 in hex", key=sha256)
    return f"{session_prefix(ref)}files/{sha256}"


def incoming_file_key(token: str) -> str:
    """Return the key under which a channel keeps a file's bytes from acceptance until the
    turn stores them under its session (`channels.files.FileStash`)."""
    _check_component("token", token)
    return f"{INCOMING_PREFIX}{token}"


def check_key(key: str) -> None:
    """Refuse a key that is empty, absolute, or has empty, `.` or `..` segments."""
    segments = key.split("/")
    if not key or "\\" in key or "\x00" in key or any(s in {"", ".", ".."} for s in segments):
        raise StorageError("invalid transcript store key", key=key)


class TranscriptStore(Protocol):
    """Where transcripts and their archives live; keys follow the layout in this module."""

    async def append_lines(
        self, ref: SessionRef, lines: Sequence[TranscriptLine], *, first_seq: int
    ) -> None:
        """Write `lines` as the segment named by `first_seq`, the first line's sequence number.

        One write, whatever the transcript's length. Writing the same batch again (a retry)
        replaces the segment with the same bytes; no lines is a no-op.
        """
        ...

    async def read_transcript(self, ref: SessionRef) -> bytes:
        """Return the whole transcript as JSONL: the legacy object, then every segment in order.

        A session without a transcript reads as empty bytes.
        """
        ...

    async def write_archive(self, key: str, data: bytes) -> StoredObject:
        """Write an immutable object; raise `ArchiveExistsError` if `key` already exists."""
        ...

    async def read(self, key: str) -> bytes:
        """Return an object's bytes; a missing key raises `StorageError` naming the key."""
        ...

    async def stat(self, key: str) -> StoredObject | None:
        """Return the object's size, or None when there is no object under `key`."""
        ...

    async def list_session(self, ref: SessionRef) -> list[str]:
        """Return every key under the session's prefix, sorted."""
        ...

    async def delete(self, key: str) -> None:
        """Delete one object; a missing one is not an error."""
        ...

    async def list_incoming(self, before: datetime) -> list[str]:
        """Return the keys under `incoming/` last written before `before` (the stash sweep)."""
        ...

    async def delete_session(self, ref: SessionRef) -> int:
        """Delete everything under the session's prefix; return how many objects went."""
        ...

    async def delete_user(self, org_id: str, user_id: str) -> int:
        """Delete every session of the user; return how many objects went."""
        ...

    async def check(self) -> None:
        """Prove the store is usable (start-up, readiness) or raise a clear `StorageError`."""
        ...

    async def close(self) -> None:
        """Release the store's connections; the store is not used afterwards."""
        ...
