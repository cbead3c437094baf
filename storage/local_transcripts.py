"""The transcript store in a local folder (`make run`'s default, and tests).

Keys are relative paths below the root; every file operation runs in a worker thread. Segments
and archives are written to a temporary file, synced and then renamed or linked into place, so
a reader sees a whole object or none. The key layout and the protocol are `storage.transcripts`.

The turns' segments are written in batches (`storage.group_commit`): the segments of the turns
that finished while one batch was being written go to the worker thread together, one hand-off
for all of them. A hand-off per segment (up to six threads writing beside the event loop) cost
a loaded gateway 4.6-4.8 CPU-ms a message against 3.3-3.7 batched (`bench/README.md`).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from errors import ArchiveExistsError, StorageError
from primitives.durable_file import write_all_durably, write_durably
from storage.group_commit import GroupCommit
from storage.transcripts import (
    INCOMING_PREFIX,
    SessionRef,
    StoredObject,
    TranscriptLine,
    check_key,
    encode_lines,
    join_transcript,
    legacy_transcript_key,
    session_prefix,
    transcript_keys,
    transcript_segment_key,
    transcript_segments_prefix,
    user_prefix,
)

_TEMP_PREFIX = ".tmp-"
# More would only hold the first turns' segments back behind the last ones'. A batch syncs its
# files one after another: on a disk whose fsync is slow, a thread per part of the batch would
# sync them at once, but here four such threads cost as much CPU a message as a thread per
# segment did (`bench/README.md`).
_SEGMENTS_PER_BATCH = 64
# Session folders whose segments were written: their next segments go straight in. Past this
# many the set starts again (each one costs a resolve and a mkdir once more).
_READY_FOLDERS = 10_000


class LocalTranscriptStore:
    """A `TranscriptStore` in a folder; keys are relative paths, all file I/O in worker threads."""

    def __init__(self, root: Path) -> None:
        """Use `root` (created on demand) as the folder that holds the `sessions/` tree."""
        self._root = root.resolve()
        self._segments: GroupCommit[tuple[str, bytes], None] = GroupCommit(
            self._write_segments, max_batch=_SEGMENTS_PER_BATCH
        )
        # A plain set: segments and deletions run in different worker threads, and each of
        # its operations is one step under the interpreter's lock.
        self._ready_folders: set[str] = set()

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
        """Write the segment atomically (temporary file, fsync, rename), then fsync its folder,
        in the next batch of segments; a failure is this segment's alone."""
        key = transcript_segment_key(ref, first_seq)
        if lines:
            await self._segments.submit((key, encode_lines(lines)))

    async def _write_segments(self, segments: list[tuple[str, bytes]]) -> list[StorageError | None]:
        """A batch of (key, bytes) segments, in one worker thread; each one's error alone."""
        return await asyncio.to_thread(self._write_segments_sync, segments)

    def _write_segments_sync(self, segments: list[tuple[str, bytes]]) -> list[StorageError | None]:
        # A reader sees the whole segment or none of it; a retry of the same turn replaces it
        # with the same bytes. The batch's files are written, then flushed, in phases
        # (`write_all_durably`).
        results: list[StorageError | None] = [None] * len(segments)
        placed: list[tuple[int, Path, bool]] = []  # index, path, folder known to exist
        for index, (key, _) in enumerate(segments):
            try:
                placed.append((index, *self._segment_path(key)))
            except StorageError as exc:
                results[index] = exc
            except OSError as exc:
                results[index] = _segment_error(exc, key)
        errors = write_all_durably(
            [(path, segments[index][1]) for index, path, _ in placed], temp_prefix=_TEMP_PREFIX
        )
        for (index, _, known), written in zip(placed, errors, strict=True):
            key, data = segments[index]
            error: StorageError | OSError | None = written
            if isinstance(written, FileNotFoundError) and known:
                # A remembered folder that has gone (its session deleted meanwhile) is made
                # again, as the first segment's would be.
                self._ready_folders.discard(key.rpartition("/")[0])
                error = self._write_again(key, data)
            if isinstance(error, StorageError):
                results[index] = error
            elif error is not None:
                results[index] = _segment_error(error, key)
        return results

    def _write_again(self, key: str, data: bytes) -> StorageError | OSError | None:
        try:
            write_durably(self._path(key), data, temp_prefix=_TEMP_PREFIX)
        except (StorageError, OSError) as exc:
            return exc
        return None

    def _segment_path(self, key: str) -> tuple[Path, bool]:
        """Where a segment goes, its folder made, and whether that folder was remembered.
        A folder this store made and found inside the root is remembered: the session's next
        segments skip resolving the key and making the folder, a dozen system calls a segment,
        each one a moment where the event loop's thread and this one hand the interpreter's
        lock to each other."""
        check_key(key)
        folder = key.rpartition("/")[0]
        if folder in self._ready_folders:
            return self._root / key, True
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        if len(self._ready_folders) >= _READY_FOLDERS:
            self._ready_folders.clear()
        self._ready_folders.add(folder)
        return path, False

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
        # Linked, not renamed: a complete file appears under the key or nothing does, and an
        # existing archive is never replaced.
        try:
            write_durably(self._path(key), data, temp_prefix=_TEMP_PREFIX, replace=False)
        except FileExistsError as exc:
            raise ArchiveExistsError("archive already exists", key=key) from exc
        except OSError as exc:
            raise StorageError(f"cannot write archive: {exc}", key=key) from exc
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

    async def delete(self, key: str) -> None:
        """Remove the file under `key`; a missing one is not an error."""
        await asyncio.to_thread(self._delete_one_sync, key)

    def _delete_one_sync(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot delete transcript object: {exc}", key=key) from exc

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

    async def list_incoming(self, before: datetime) -> list[str]:
        """Return the stash's keys whose file was last written before `before`."""
        return await asyncio.to_thread(self._list_older_sync, INCOMING_PREFIX, before)

    def _list_older_sync(self, prefix: str, before: datetime) -> list[str]:
        cutoff = before.timestamp()
        older = []
        for key in self._list_sync(prefix):
            try:
                if self._path(key).stat().st_mtime < cutoff:
                    older.append(key)
            except FileNotFoundError:
                continue  # taken by its turn meanwhile
        return older

    async def delete_session(self, ref: SessionRef) -> int:
        """Delete the session's folder and any parents it leaves empty; return files removed."""
        return await asyncio.to_thread(self._delete_sync, session_prefix(ref))

    async def delete_user(self, org_id: str, user_id: str) -> int:
        """Delete the user's folder and any parents it leaves empty; return files removed."""
        return await asyncio.to_thread(self._delete_sync, user_prefix(org_id, user_id))

    def _delete_sync(self, prefix: str) -> int:
        # Segments for these folders resolve and make them again (deleting is rare).
        self._ready_folders.clear()
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

    async def close(self) -> None:
        """Wait for the segments already queued; every call opens and closes its own files."""
        await self._segments.drained()

    def _check_sync(self) -> None:
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self._root, prefix=_TEMP_PREFIX) as probe:
                probe.write(b"ok")
                probe.flush()
        except OSError as exc:
            raise StorageError(f"transcript folder {self._root} is not writable: {exc}") from exc


def _segment_error(exc: OSError, key: str) -> StorageError:
    return StorageError(f"cannot write transcript segment: {exc}", key=key)


def _raise(exc: OSError) -> None:
    """`os.walk` error hook: surface errors instead of silently skipping folders."""
    raise exc
