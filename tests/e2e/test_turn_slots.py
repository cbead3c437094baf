"""`sessions.max_concurrent_turns` counts turns at work or waiting for the model, not those
whose reply is sent and whose transcript segment is being written: a slow transcript store
keeps its own user waiting (per-user order), not everyone."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from storage.transcripts import SessionRef, TranscriptLine, parse_transcript
from tests.e2e.harness import gateway_config, running_gateway


async def test_a_turn_writing_its_transcript_leaves_its_place_to_another_users_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
    config = gateway_config(url, tmp_path, sessions={"max_concurrent_turns": 1})
    store_answers = asyncio.Event()
    alice_waits = asyncio.Event()
    async with running_gateway(config) as gateway:
        store = gateway.runtime.service.transcripts
        append = store.append_lines

        async def slow_for_alice(
            ref: SessionRef, lines: Sequence[TranscriptLine], *, first_seq: int
        ) -> None:
            if ref.user_id == "alice":
                alice_waits.set()
                await store_answers.wait()
            await append(ref, lines, first_seq=first_seq)

        monkeypatch.setattr(store, "append_lines", slow_for_alice)
        await gateway.post("alice", "hello", message_id="a1")
        await asyncio.wait_for(alice_waits.wait(), timeout=10)
        await gateway.post("alice", "and then", message_id="a2")
        await gateway.post("bob", "hi", message_id="b1")
        # Bob's turn runs in the one place while Alice's segment waits for the store ...
        await gateway.wait_for_replies("bob", 1)
        # ... and Alice's next message waits behind her own turn, still hers to finish.
        assert [reply["in_reply_to"] for reply in await gateway.all_replies("alice")] == ["a1"]
        assert gateway.runtime.dispatcher.is_draining("alice")
        store_answers.set()
        replies = await gateway.wait_for_replies("alice", 2)
        await gateway.wait_for_turns_to_end("alice")
        assert [reply["in_reply_to"] for reply in replies] == ["a1", "a2"]
        ref = SessionRef("acme", "alice", replies[0]["session_id"])
        lines = parse_transcript(await store.read_transcript(ref))
    assert [line.content for line in lines if line.role == "user"] == ["hello", "and then"]
