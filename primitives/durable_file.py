"""Writing a file so that it holds all of its bytes or does not exist: a reader (or a crash)
never sees half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_durably(
    path: Path, data: bytes, *, temp_prefix: str, replace: bool = True, folder_exists: bool = False
) -> None:
    """Write `data` to `path` through a temporary file in the same folder (hidden behind
    `temp_prefix`), flushed to disk, then renamed over `path` (`replace`) or linked to it
    (`replace=False`: `FileExistsError` when `path` exists, which is never overwritten); the
    folder is flushed too, so the new name survives a crash. The folder is made first unless
    the caller knows it is there (`folder_exists`: `FileNotFoundError` if it is not). Raises
    `OSError`.

    Eight system calls when the folder exists and the file is renamed into place, each of them
    a moment where another thread may take the interpreter's lock (a segment writer beside an
    event loop): no folder made, no buffered file object, no unlink after a rename."""
    if not folder_exists:
        path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix)
    renamed = False
    try:
        try:
            left = memoryview(data)
            while left:
                left = left[os.write(handle, left) :]
            os.fsync(handle)
        finally:
            os.close(handle)
        if replace:
            os.replace(temporary, path)
            renamed = True
        else:
            os.link(temporary, path)
        _fsync_folder(path.parent)
    finally:
        if not renamed:  # a link leaves the temporary name, a failure the whole file
            Path(temporary).unlink(missing_ok=True)


def _fsync_folder(folder: Path) -> None:
    """Make a new directory entry durable; without this a crash can lose a flushed file."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
