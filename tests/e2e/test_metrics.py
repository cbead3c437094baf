"""The Prometheus metrics follow a conversation: messages, duplicates, turns, tokens, backlog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from errors import StorageError
from tests.e2e.harness import gateway_config, running_gateway


async def test_metrics_count_a_conversation_and_read_the_backlogs(tmp_path: Path) -> None:
    config = gateway_config(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", tmp_path)
    async with running_gateway(config) as gateway:
        await gateway.post("alice", "hello", message_id="m1")
        await gateway.post("alice", "hello", message_id="m1")
        await gateway.wait_for_replies("alice", 1)
        text = (await gateway.client.get("/metrics")).text
    lines = set(text.splitlines())
    assert 'gateway_messages_in_total{channel="web"} 1.0' in lines
    assert 'gateway_duplicates_dropped_total{channel="web"} 1.0' in lines
    assert 'gateway_messages_out_total{channel="web",outcome="delivered"} 1.0' in lines
    assert "gateway_turn_duration_seconds_count 1.0" in lines
    assert "gateway_active_sessions 1.0" in lines
    assert "gateway_outbox_backlog 0.0" in lines
    assert "gateway_inbox_backlog 0.0" in lines
    tokens = [line for line in lines if line.startswith("gateway_llm_tokens_total")]
    assert {'kind="input"' in line for line in tokens} == {True, False}
    assert all(float(line.rpartition(" ")[2]) > 0 for line in tokens)


class ArchiveRefusingStore:
    """A transcript store whose archive writes fail (the rest is the real store)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def write_archive(self, key: str, data: bytes) -> Any:
        raise StorageError(f"cannot write {key}: the store is down", key=key)


async def test_a_compaction_that_cannot_archive_counts_as_an_archive_failure(
    tmp_path: Path,
) -> None:
    config = gateway_config(
        f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        tmp_path,
        sessions={"compaction": {"max_messages": 2, "keep_last_messages": 1}},
    )
    async with running_gateway(config) as gateway:
        compactor = gateway.runtime.engine.compactor
        compactor.transcripts = ArchiveRefusingStore(compactor.transcripts)  # type: ignore[assignment]
        for n in range(3):
            await gateway.post("alice", f"message {n}")
            await gateway.wait_for_replies("alice", n + 1, settle=0)
        text = (await gateway.client.get("/metrics")).text
    failures = [
        line for line in text.splitlines() if line.startswith("gateway_archive_failures_total")
    ]
    assert failures
    assert float(failures[0].rpartition(" ")[2]) >= 1
    assert "gateway_compactions_total 0.0" in text.splitlines()
