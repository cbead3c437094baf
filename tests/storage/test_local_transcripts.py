"""The local folder store: what only files can get wrong (a symlink out of the root,
temporary files, folders left empty, two stores on one folder), and an append to a long
session writing no more than one to a short one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from errors import ArchiveExistsError, StorageError
from storage.local_transcripts import LocalTranscriptStore
from storage.transcripts import (
    SessionRef,
    compaction_key,
    encode_lines,
    legacy_transcript_key,
    parse_transcript,
    pre_compact_archive_key,
)
from tests.storage.transcript_samples import REF, line, segment, turn


async def test_local_key_escaping_root_through_a_symlink_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (root / "sessions").mkdir(parents=True)
    (root / "sessions" / "acme").symlink_to(outside)
    store = LocalTranscriptStore(root)

    with pytest.raises(StorageError, match="outside"):
        await store.read("sessions/acme/secret")
    with pytest.raises(StorageError, match="outside"):
        await store.write_archive("sessions/acme/new", b"x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


async def test_local_writes_leave_no_temp_files(tmp_path: Path) -> None:
    store = LocalTranscriptStore(tmp_path)
    key = compaction_key(REF, 1)
    await store.write_archive(key, b"one")
    with pytest.raises(ArchiveExistsError):
        await store.write_archive(key, b"two")
    await store.append_lines(REF, turn(1), first_seq=1)
    await store.append_lines(REF, turn(1), first_seq=1)

    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files == [key, segment(REF, 1)]


async def test_local_a_temp_file_left_by_a_crash_is_not_part_of_the_transcript(
    tmp_path: Path,
) -> None:
    store = LocalTranscriptStore(tmp_path)
    await store.append_lines(REF, turn(1), first_seq=1)
    leftover = tmp_path / segment(REF, 1)
    leftover.with_name(".tmp-crashed").write_bytes(b'{"torn')

    assert parse_transcript(await store.read_transcript(REF)) == turn(1)
    assert await store.list_session(REF) == [segment(REF, 1)]
    assert await store.delete_session(REF) == 2  # the leftover goes too
    assert list(tmp_path.iterdir()) == []


def files_of(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under `root`: its size, inode and modification time."""
    return {
        p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_ino, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


async def test_local_the_10000th_append_writes_what_the_10th_did(tmp_path: Path) -> None:
    store = LocalTranscriptStore(tmp_path)
    short, long = SessionRef("acme", "alice", "short"), SessionRef("acme", "alice", "long")
    for first_seq in range(1, 9, 2):
        await store.append_lines(short, turn(first_seq), first_seq=first_seq)
    # 9,998 messages: most in a legacy file (quick to make), the last turns as segments.
    legacy = [line for first_seq in range(1, 9_991, 2) for line in turn(first_seq)]
    await store.write_archive(legacy_transcript_key(long), encode_lines(legacy))
    for first_seq in range(9_991, 9_999, 2):
        await store.append_lines(long, turn(first_seq), first_seq=first_seq)

    written = {}
    for ref, first_seq in [(short, 9), (long, 9_999)]:
        before = files_of(tmp_path)
        await store.append_lines(ref, turn(first_seq), first_seq=first_seq)
        after = files_of(tmp_path)
        # One new file of the turn's bytes; nothing that was there is rewritten or replaced.
        assert {k: v for k, v in after.items() if k in before} == before
        assert list(after.keys() - before.keys()) == [segment(ref, first_seq)]
        written[first_seq] = after[segment(ref, first_seq)][0]

    assert written[9] == written[9_999] == len(encode_lines(turn(1)))
    lines = parse_transcript(await store.read_transcript(long))
    assert len(lines) == 10_000
    assert lines[-2:] == turn(9_999)


async def test_local_delete_removes_the_folders_it_empties(tmp_path: Path) -> None:
    store = LocalTranscriptStore(tmp_path)
    await store.write_archive(pre_compact_archive_key(REF, 1), b"x")
    await store.append_lines(REF, turn(1), first_seq=1)
    await store.append_lines(SessionRef("acme", "bob", "s1"), [line(1)], first_seq=1)

    await store.delete_session(REF)
    assert not (tmp_path / "sessions/acme/alice").exists()
    assert (tmp_path / "sessions/acme/bob/s1").is_dir()

    await store.delete_user("acme", "bob")
    assert list(tmp_path.iterdir()) == []


async def test_local_appends_from_two_stores_on_one_folder_lose_no_line(tmp_path: Path) -> None:
    first, second = LocalTranscriptStore(tmp_path), LocalTranscriptStore(tmp_path)
    await asyncio.gather(
        *(
            (first if i % 2 else second).append_lines(REF, [line(i)], first_seq=i)
            for i in range(1, 21)
        )
    )
    assert parse_transcript(await second.read_transcript(REF)) == [line(i) for i in range(1, 21)]


async def test_local_check_fails_clearly_when_the_folder_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StorageError, match="not writable"):
        await LocalTranscriptStore(blocker / "transcripts").check()


async def test_local_segments_of_turns_finishing_together_go_to_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed_off: list[int] = []
    to_thread = asyncio.to_thread

    async def counting(function: Any, segments: list[Any]) -> Any:
        handed_off.append(len(segments))
        return await to_thread(function, segments)

    store = LocalTranscriptStore(tmp_path)
    refs = [SessionRef("acme", f"user{i}", f"s{i}") for i in range(10)]
    with monkeypatch.context() as patched:
        patched.setattr("storage.local_transcripts.asyncio.to_thread", counting)
        await asyncio.gather(*(store.append_lines(ref, turn(1), first_seq=1) for ref in refs))
        await asyncio.gather(*(store.append_lines(ref, turn(3), first_seq=3) for ref in refs))

    assert handed_off == [10, 10]
    for ref in refs:
        assert parse_transcript(await store.read_transcript(ref)) == turn(1) + turn(3)


async def test_local_a_segment_that_cannot_be_written_fails_alone_in_its_batch(
    tmp_path: Path,
) -> None:
    store = LocalTranscriptStore(tmp_path)
    blocked = SessionRef("acme", "bob", "s2")
    (tmp_path / "sessions" / "acme").mkdir(parents=True)
    (tmp_path / "sessions" / "acme" / "bob").write_bytes(b"not a folder")

    results = await asyncio.gather(
        store.append_lines(REF, turn(1), first_seq=1),
        store.append_lines(blocked, turn(1), first_seq=1),
        store.append_lines(REF, turn(3), first_seq=3),
        return_exceptions=True,
    )

    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], StorageError)
    assert "cannot write transcript segment" in str(results[1])
    assert parse_transcript(await store.read_transcript(REF)) == turn(1) + turn(3)
    await store.close()


async def test_local_a_sessions_later_segments_neither_resolve_nor_make_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first segment of a session checks its key against the root and makes its folder;
    the next ones go straight in (each system call skipped is one hand-over of the
    interpreter's lock between the event loop and the writer). A folder deleted meanwhile
    is made again."""
    resolved: list[Path] = []
    made: list[Path] = []
    resolve, mkdir = Path.resolve, Path.mkdir

    def counting_resolve(path: Path, strict: bool = False) -> Path:
        resolved.append(path)
        return resolve(path, strict)

    def counting_mkdir(path: Path, *args: Any, **kwargs: Any) -> None:
        made.append(path)
        mkdir(path, *args, **kwargs)

    store = LocalTranscriptStore(tmp_path)
    with monkeypatch.context() as patched:
        patched.setattr(Path, "resolve", counting_resolve)
        patched.setattr(Path, "mkdir", counting_mkdir)
        await store.append_lines(REF, turn(1), first_seq=1)
        first = (len(resolved), len(made))
        for first_seq in (3, 5):
            await store.append_lines(REF, turn(first_seq), first_seq=first_seq)
        assert first[0] == 1
        assert first[1] > 0
        assert (len(resolved), len(made)) == first

        await store.delete_session(REF)
        await store.append_lines(REF, turn(7), first_seq=7)
    assert parse_transcript(await store.read_transcript(REF)) == turn(7)
    assert [p.name for p in (tmp_path / segment(REF, 7)).parent.iterdir()] == [
        Path(segment(REF, 7)).name
    ]


async def test_local_a_remembered_folder_removed_behind_the_stores_back_is_made_again(
    tmp_path: Path,
) -> None:
    store = LocalTranscriptStore(tmp_path)
    await store.append_lines(REF, turn(1), first_seq=1)
    folder = (tmp_path / segment(REF, 1)).parent
    for leftover in folder.iterdir():
        leftover.unlink()
    folder.rmdir()  # another process deleting the session, say
    await store.append_lines(REF, turn(3), first_seq=3)
    assert parse_transcript(await store.read_transcript(REF)) == turn(3)
