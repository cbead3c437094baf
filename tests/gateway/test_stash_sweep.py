"""The stash sweep: stashed bytes no waiting message names are deleted, never one a pending
message still needs, nor one too young to be named yet."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

from gateway.files import STASH_MIN_AGE, sweep_stash
from storage.database import Database
from storage.local_transcripts import LocalTranscriptStore
from storage.models import InboundStatus
from storage.repositories.inbox import InboxRepository
from storage.transcripts import incoming_file_key


async def stash(store: LocalTranscriptStore, root: Path, token: str, *, age: float) -> str:
    key = incoming_file_key(token)
    await store.write_archive(key, token.encode())
    written = time.time() - age
    os.utime(root / key, (written, written))
    return key


async def accept_with_file(database: Database, message_id: str, token: str) -> int:
    record = {"attachments": [{"filename": "a.pdf", "source": {"stash": token}}]}
    async with database.session() as db:
        event_id = await InboxRepository(db).accept(
            "email",
            message_id,
            sender_key="email:alice@example.com",
            message=record,
            raw_payload={},
            at=datetime.now(UTC),
        )
    assert event_id is not None
    return event_id


async def test_only_old_stashes_no_pending_message_names_are_swept(
    database: Database, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    store = LocalTranscriptStore(root)
    old = STASH_MIN_AGE.total_seconds() + 60
    waited = await stash(store, root, "waited", age=old)
    answered = await stash(store, root, "answered", age=old)
    orphan = await stash(store, root, "orphan", age=old)
    young = await stash(store, root, "young", age=1)
    await accept_with_file(database, "m-waited", "waited")
    done = await accept_with_file(database, "m-answered", "answered")
    async with database.session() as db:
        await InboxRepository(db).finish(done, InboundStatus.DONE, at=datetime.now(UTC))

    assert await sweep_stash(database, store, datetime.now(UTC)) == 2
    left = {key for key in (waited, answered, orphan, young) if (root / key).exists()}
    assert left == {waited, young}
    assert await sweep_stash(database, store, datetime.now(UTC)) == 0
