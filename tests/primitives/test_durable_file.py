"""`write_durably`: a file holds all of its bytes or does not exist, and no temporary is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from primitives.durable_file import write_durably


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


def test_a_write_into_a_folder_said_to_exist_makes_none(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "segment.jsonl"
    with pytest.raises(FileNotFoundError):
        write_durably(target, b"data", temp_prefix=".tmp-", folder_exists=True)
    assert list(tmp_path.iterdir()) == []
    big = bytes(range(256)) * 40_000  # 10 MB: more than one write may take
    write_durably(tmp_path / "big", big, temp_prefix=".tmp-", folder_exists=True)
    assert (tmp_path / "big").read_bytes() == big
    assert [path.name for path in tmp_path.iterdir()] == ["big"]
