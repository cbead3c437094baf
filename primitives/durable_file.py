"""Writing a file so that it holds all of its bytes or does not exist: a reader (or a crash)
never sees half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_durably(path: Path, data: bytes, *, temp_prefix: str, replace: bool = True) -> None:
    """Write `data` to `path` through a temporary file in the same folder (hidden behind
    `temp_prefix`), flushed to disk, then renamed over `path` (`replace`) or linked to it
    (`replace=False`: `FileExistsError` when `path` exists, which is never overwritten); the
    folder is flushed too, so the new name survives a crash. Raises `OSError`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
        _fsync_folder(path.parent)
    finally:
        Path(temporary).unlink(missing_ok=True)  # left only when the rename did not happen


def _fsync_folder(folder: Path) -> None:
    """Make a new directory entry durable; without this a crash can lose a flushed file."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
