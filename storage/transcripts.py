"""Transcript storage: the values, the key layout, the `TranscriptStore` protocol, the local store.

A session's transcript lives outside the database, in a folder or an S3 bucket, under keys
that are the same for every backend::

    sessions/{org_id}/{user_id}/{session_id}/transcript/{first_seq:010d}.jsonl
    sessions/{org_id}/{user_id}/{session_id}/transcript.jsonl      (legacy, read only)
    sessions/{org_id}/{user_id}/{session_id}/compact_001.json
    sessions/{org_id}/{user_id}/{session_id}/archive/full_transcript_pre_compact_001.jsonl

A transcript is append-only segments: each `append_lines` (one turn: the user's message and
the assistant's) writes one new object named by the session sequence number of its first line,
so an append costs the same for the 10,000th message as for the 10th (S3 has no append, and
rewriting one growing object costs the whole transcript every time). `read_transcript` returns
the legacy `transcript.jsonl` that earlier versions grew in place, if there is one, then the
segments in key order (ten digits keep key order and number order the same).

Compactions and pre-compact archives are immutable objects (`write_archive` never overwrites).
This module owns those values and keys, the `TranscriptStore` protocol and
`LocalTranscriptStore`; the S3 backend is in `storage.s3_transcripts`. Neither store knows what
a compaction is: that is `sessions/`' job.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from errors import ArchiveExistsError, StorageError

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

    async def delete_session(self, ref: SessionRef) -> int:
        """Delete everything under the session's prefix; return how many objects went."""
        ...

    async def delete_user(self, org_id: str, user_id: str) -> int:
        """Delete every session of the user; return how many objects went."""
        ...

    async def check(self) -> None:
        """Prove the store is usable (start-up, readiness) or raise a clear `StorageError`."""
        ...


_TEMP_PREFIX = ".tmp-"


class LocalTranscriptStore:
    """A `TranscriptStore` in a folder; keys are relative paths, all file I/O in worker threads."""

    def __init__(self, root: Path) -> None:
        """Use `root` (created on demand) as the folder that holds the `sessions/` tree."""
        self._root = root.resolve()

    def _path(self, key: str) -> Path:
        """Map a key to its path; refuse one that resolves outside root (e.g. via a symlink)."""
        check_key(key)
        path = (self._root / key).resolve()
        if path == self._root or not path.is_relative_to(self._root):
            raise StorageError("key resolves outside the transcript folder", key=key)
        return path

    async def append_lines(
        self, ref: SessionRef, lines: Sequence[TranscriptLine], *, first_seq: int
    ) -> None:
        """Write the segment atomically (temporary file, fsync, rename), then fsync its folder."""
        key = transcript_segment_key(ref, first_seq)
        if lines:
            await asyncio.to_thread(self._write_segment_sync, key, encode_lines(lines))

    def _write_segment_sync(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=_TEMP_PREFIX)
        except OSError as exc:
            raise StorageError(f"cannot write transcript segment: {exc}", key=key) from exc
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            # A reader sees the whole segment or none of it; a retry of the same batch replaces
            # it with the same bytes (rename replaces, unlike the archives' link).
            os.replace(tmp_name, path)
            _fsync_dir(path.parent)
        except OSError as exc:
            raise StorageError(f"cannot write transcript segment: {exc}", key=key) from exc
        finally:
            Path(tmp_name).unlink(missing_ok=True)  # left only when the rename did not happen

    async def read_transcript(self, ref: SessionRef) -> bytes:
        """Read the legacy file, then the segments in key order, in one worker thread."""
        return await asyncio.to_thread(self._read_transcript_sync, ref)

    def _read_transcript_sync(self, ref: SessionRef) -> bytes:
        listed = self._list_sync(transcript_segments_prefix(ref))
        legacy = legacy_transcript_key(ref)
        if self._stat_sync(legacy) is not None:
            listed.append(legacy)
        return join_transcript(self._read_sync(key) for key in transcript_keys(ref, listed))

    async def write_archive(self, key: str, data: bytes) -> StoredObject:
        """Write `data` atomically under `key`; an existing object raises `ArchiveExistsError`."""
        return await asyncio.to_thread(self._write_archive_sync, key, data)

    def _write_archive_sync(self, key: str, data: bytes) -> StoredObject:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=_TEMP_PREFIX)
        except OSError as exc:
            raise StorageError(f"cannot create archive: {exc}", key=key) from exc
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            # link() fails if the name exists, so a complete file appears under the key or
            # nothing does, and an existing archive is never replaced (rename would replace it).
            os.link(tmp_name, path)
            _fsync_dir(path.parent)
        except FileExistsError as exc:
            raise ArchiveExistsError("archive already exists", key=key) from exc
        except OSError as exc:
            raise StorageError(f"cannot write archive: {exc}", key=key) from exc
        finally:
            Path(tmp_name).unlink(missing_ok=True)
        return StoredObject(key=key, size=len(data))

    async def read(self, key: str) -> bytes:
        """Return the bytes under `key`; a missing key raises `StorageError` naming it."""
        return await asyncio.to_thread(self._read_sync, key)

    def _read_sync(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError) as exc:
            raise StorageError("transcript object does not exist", key=key) from exc
        except OSError as exc:
            raise StorageError(f"cannot read transcript object: {exc}", key=key) from exc

    async def stat(self, key: str) -> StoredObject | None:
        """Return the size of the file under `key`, or None when there is none."""
        return await asyncio.to_thread(self._stat_sync, key)

    def _stat_sync(self, key: str) -> StoredObject | None:
        path = self._path(key)
        try:
            return StoredObject(key=key, size=path.stat().st_size) if path.is_file() else None
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot stat transcript object: {exc}", key=key) from exc

    async def list_session(self, ref: SessionRef) -> list[str]:
        """Return the keys of every file of the session, sorted (leftover temp files excluded)."""
        return await asyncio.to_thread(self._list_sync, session_prefix(ref))

    def _list_sync(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/"))
        keys = []
        try:
            for dirpath, _dirnames, filenames in os.walk(base, onerror=_raise):
                for name in filenames:
                    if not name.startswith(_TEMP_PREFIX):
                        keys.append(Path(dirpath, name).relative_to(self._root).as_posix())
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"cannot list transcript folder: {exc}", key=prefix) from exc
        return sorted(keys)

    async def delete_session(self, ref: SessionRef) -> int:
        """Delete the session's folder and any parents it leaves empty; return files removed."""
        return await asyncio.to_thread(self._delete_sync, session_prefix(ref))

    async def delete_user(self, org_id: str, user_id: str) -> int:
        """Delete the user's folder and any parents it leaves empty; return files removed."""
        return await asyncio.to_thread(self._delete_sync, user_prefix(org_id, user_id))

    def _delete_sync(self, prefix: str) -> int:
        base = self._path(prefix.rstrip("/"))
        removed = 0
        try:
            # Bottom-up, so every folder is empty by the time it is removed. Leftover temp
            # files are removed (and counted) too: deletion must leave nothing behind.
            for dirpath, _dirnames, filenames in os.walk(base, topdown=False, onerror=_raise):
                for name in filenames:
                    os.unlink(os.path.join(dirpath, name))
                    removed += 1
                os.rmdir(dirpath)
        except FileNotFoundError:
            pass  # nothing (left) to delete: deleting twice is not an error
        except OSError as exc:
            raise StorageError(f"cannot delete transcript folder: {exc}", key=prefix) from exc
        self._prune_empty_parents(base.parent)
        return removed

    def _prune_empty_parents(self, folder: Path) -> None:
        while folder != self._root and folder.is_relative_to(self._root):
            try:
                folder.rmdir()
            except OSError:
                return  # not empty (another session/user lives there) or already gone
            folder = folder.parent

    async def check(self) -> None:
        """Create the folder if needed and prove a file can be written and removed there."""
        await asyncio.to_thread(self._check_sync)

    def _check_sync(self) -> None:
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self._root, prefix=_TEMP_PREFIX) as probe:
                probe.write(b"ok")
                probe.flush()
        except OSError as exc:
            raise StorageError(f"transcript folder {self._root} is not writable: {exc}") from exc


def _raise(exc: OSError) -> None:
    """`os.walk` error hook: surface errors instead of silently skipping folders."""
    raise exc


def _fsync_dir(folder: Path) -> None:
    """Make a new directory entry durable; without this a crash can lose a fsynced file."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
