"""`write_durably` and `write_all_durably`: a file holds all of its bytes or does not exist,
and no temporary is left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from primitives.durable_file import write_all_durably, write_durably


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "folder" / "reply.eml"
    write_durably(target, b"first", temp_prefix=".tmp-")
    write_durably(target, b"second", temp_prefix=".tmp-")
    assert target.read_bytes() == b"second"
    assert [path.name for path in target.parent.iterdir()] == ["reply.eml"]


def test_a_link_never_overwrites_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "archive.jsonl"
    write_durably(target, b"kept", temp_prefix=".tmp-", replace=False)
    with pytest.raises(FileExistsError):
        write_durably(target, b"refused", temp_prefix=".tmp-", replace=False)
    assert target.read_bytes() == b"kept"
    assert [path.name for path in tmp_path.iterdir()] == ["archive.jsonl"]


def test_a_failed_write_raises_oserror_and_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "folder"
    target.mkdir()
    with pytest.raises(IsADirectoryError):
        write_durably(target, b"data", temp_prefix=".tmp-")  # a folder cannot be replaced
    assert list(target.iterdir()) == []
    assert [path.name for path in tmp_path.iterdir()] == ["folder"]


def test_a_file_larger_than_one_write_is_written_whole(tmp_path: Path) -> None:
    big = bytes(range(256)) * 40_000  # 10 MB: more than one write may take
    write_durably(tmp_path / "big", big, temp_prefix=".tmp-")
    assert (tmp_path / "big").read_bytes() == big
    assert [path.name for path in tmp_path.iterdir()] == ["big"]


def test_files_written_together_each_whole_and_a_failure_only_its_own(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "taken").mkdir()  # a folder cannot be replaced by a file
    (tmp_path / "a" / "old.jsonl").write_bytes(b"before")
    files = [
        (tmp_path / "a" / "one.jsonl", b"1"),
        (tmp_path / "missing" / "two.jsonl", b"2"),  # no such folder
        (tmp_path / "b" / "taken", b"3"),
        (tmp_path / "a" / "old.jsonl", b"after"),
        (tmp_path / "b" / "four.jsonl", bytes(range(256)) * 40_000),
    ]
    errors = write_all_durably(files, temp_prefix=".tmp-")
    assert errors[0] is None
    assert isinstance(errors[1], FileNotFoundError)
    assert isinstance(errors[2], IsADirectoryError)
    assert errors[3] is None
    assert errors[4] is None
    assert (tmp_path / "a" / "one.jsonl").read_bytes() == b"1"
    assert (tmp_path / "a" / "old.jsonl").read_bytes() == b"after"
    assert (tmp_path / "b" / "four.jsonl").read_bytes() == bytes(range(256)) * 40_000
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a", "b"]
    assert sorted(path.name for path in (tmp_path / "a").iterdir()) == ["old.jsonl", "one.jsonl"]
    assert sorted(path.name for path in (tmp_path / "b").iterdir()) == ["four.jsonl", "taken"]
    assert list((tmp_path / "b" / "taken").iterdir()) == []
    assert write_all_durably([], temp_prefix=".tmp-") == []


def test_files_written_together_are_all_written_before_the_first_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The phases that let the first flushes commit what the later ones would."""
    folders = [tmp_path / f"session{n}" for n in range(5)]
    for folder in folders:
        folder.mkdir()
    seen_at_flushes: list[int] = []
    fsync = os.fsync

    def counting_fsync(handle: int) -> None:
        seen_at_flushes.append(sum(len(list(folder.glob(".tmp-*"))) for folder in folders))
        fsync(handle)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    errors = write_all_durably(
        [(folder / "segment.jsonl", b"x") for folder in folders], temp_prefix=".tmp-"
    )
    assert errors == [None] * 5
    # Five files, then five folders, flushed; the first flush came after all five were written.
    assert len(seen_at_flushes) == 10
    assert seen_at_flushes[0] == 5
