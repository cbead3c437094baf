"""What administrators do to sessions and users: list, show, export, archive, delete, link.

The CLI (`gateway sessions …`, `gateway users …`) and the admin HTTP API (`/admin/v1/`) both
call `Administration`; its answers are plain JSON data in the shapes of the external contract
(`docs/ARCHITECTURE.md`). Deleting goes through the session lifecycle
(`sessions.lifecycle.delete_session`): a logged transition to `deleted`, then the transcript
store's objects, then the rows; if the store fails, nothing of that session is gone yet and the
deletion can simply be repeated. Export zips are built in a worker thread.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import zipfile
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from errors import GatewayError
from gateway.inbox import sender_key
from gateway.log import get_logger
from sessions.export import export_session, session_record
from sessions.lifecycle import DeletionReason, archive_session, delete_session
from storage.database import Database
from storage.models import (
    Session,
    SessionChannel,
    SessionStatus,
    User,
    UserChannelIdentity,
)
from storage.repositories.admin import AdminRepository
from storage.repositories.memory import MemoryRepository
from storage.repositories.sessions import SessionRepository
from storage.repositories.users import UserRepository
from storage.transcripts import SessionRef, TranscriptStore, session_prefix, transcript_keys

log = get_logger(__name__)

T = TypeVar("T")

CHANNEL_TYPES = ("slack", "teams", "email", "web")


class NotFoundError(GatewayError):
    """The session or user named does not exist."""


@dataclass(frozen=True, slots=True)
class Deletion:
    """What a deletion removed."""

    sessions: int
    transcript_objects: int
    inbound_events: int

    def as_dict(self) -> dict[str, int]:
        """The report as JSON data."""
        return {
            "sessions": self.sessions,
            "transcript_objects": self.transcript_objects,
            "inbound_events": self.inbound_events,
        }


class Administration:
    """Admin operations over the database and the transcript store."""

    def __init__(
        self, database: Database, transcripts: TranscriptStore, clock: Callable[[], datetime]
    ) -> None:
        self.database = database
        self.transcripts = transcripts
        self.clock = clock

    # --- sessions ---------------------------------------------------------------------------

    async def list_sessions(
        self,
        *,
        user_id: str | None = None,
        status: str | None = None,
        since: timedelta | None = None,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        """Sessions, most recently active first, each with its channels."""
        async with self.database.session() as db:
            admin = AdminRepository(db)
            sessions = await admin.sessions(
                user_id=user_id,
                status=SessionStatus(status) if status is not None else None,
                active_since=self.clock() - since if since is not None else None,
                limit=limit,
            )
            channels = _channel_records(await admin.channels_of([s.id for s in sessions]))
        return [{**session_record(s), "channels": channels.get(s.id, [])} for s in sessions]

    async def show_session(self, session_id: str) -> dict[str, Any]:
        """Everything stored about one session (metadata, channels, messages, compactions)."""
        async with self.database.session() as db:
            session = await _session(db, session_id)
            return await export_session(db, session)

    async def archive_session(self, session_id: str) -> dict[str, Any]:
        """Archive an active session (its summary is written by the background job)."""
        async with self.database.session() as db:
            session = await archive_session(db, session_id, at=self.clock(), reason="admin")
            if session is None:
                raise NotFoundError(f"no session {session_id!r}")
            return session_record(session)

    async def delete_session(
        self, session_id: str, *, reason: DeletionReason = "admin"
    ) -> Deletion:
        """Delete one session through the lifecycle (`sessions.lifecycle.delete_session`): the
        logged transition to `deleted`, its transcript objects, then its rows. `reason` names
        who asked (the retention job passes its own)."""
        objects = await self._delete_session(session_id, reason)
        if objects is None:
            raise NotFoundError(f"no session {session_id!r}")
        log.info("admin.session_deleted", session_id=session_id, transcript_objects=objects)
        return Deletion(sessions=1, transcript_objects=objects, inbound_events=0)

    async def _delete_session(self, session_id: str, reason: DeletionReason) -> int | None:
        # One transaction per session, its row locked: a failure leaves whole sessions behind,
        # and repeating the deletion finishes the work.
        async with self.database.session() as db:
            session = await SessionRepository(db).get(session_id, for_update=True)
            if session is None:
                return None
            return await delete_session(
                db, session, transcripts=self.transcripts, at=self.clock(), reason=reason
            )

    async def delete_user(self, user_id: str) -> Deletion:
        """Delete everything of one user: each session through the lifecycle (as
        `delete_session`), what else the transcript store holds of them, every row that holds
        their words (also messages not yet attributed to them), and the user row with its
        identities. Configured users come back, empty, at the next start."""
        async with self.database.session() as db:
            user = await db.get(User, user_id)
            if user is None:
                raise NotFoundError(f"no user {user_id!r}")
            org_id = user.org_id
            identities = await UserRepository(db).identities(user_id)
            sessions = await SessionRepository(db).list_for_user(user_id, limit=1_000_000)
        count = objects = 0
        for session in sessions:
            deleted = await self._delete_session(session.id, "admin")
            if deleted is not None:
                count, objects = count + 1, objects + deleted
        objects += await self.transcripts.delete_user(org_id, user_id)
        keys = [sender_key(i.channel_type, i.external_id) for i in identities]
        async with self.database.session() as db:
            # A session begun meanwhile goes the same way before the user row takes it along.
            for session in await SessionRepository(db).list_for_user(user_id, limit=1_000_000):
                objects += await delete_session(
                    db, session, transcripts=self.transcripts, at=self.clock(), reason="admin"
                )
                count += 1
            inbound = await AdminRepository(db).delete_events_of_senders(keys)
            await UserRepository(db).delete(user_id)
        log.info("admin.user_deleted", user_id=user_id, sessions=count, transcript_objects=objects)
        return Deletion(sessions=count, transcript_objects=objects, inbound_events=inbound)

    async def export_zip(
        self,
        out: Path,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, int]:
        """Write a zip of one session or of all of a user's sessions: `session.json`, the
        transcript and every archive per session, and the user's memory facts. Compressing
        and writing happen in a worker thread, never on the event loop."""
        async with self.database.session() as db:
            if session_id is not None:
                sessions = [await _session(db, session_id)]
                owner = sessions[0].user_id
            elif user_id is not None:
                if await db.get(User, user_id) is None:
                    raise NotFoundError(f"no user {user_id!r}")
                sessions = await SessionRepository(db).list_for_user(user_id, limit=1_000_000)
                owner = user_id
            else:
                raise ValueError("a session id or a user id is required")
            facts = await MemoryRepository(db).facts(owner, limit=100_000)
        files = 0
        async with _zip_file(out) as archive:
            for index, session in enumerate(sessions, start=1):
                files += await self._export_one(archive, session)
                if on_progress is not None:
                    on_progress(index, len(sessions))
            facts_data = [
                {"key": f.fact_key, "fact": f.fact, "category": f.category} for f in facts
            ]
            await archive.write_json("memory_facts.json", facts_data)
            files += 1
        log.info("admin.exported", user_id=owner, sessions=len(sessions), path=str(out))
        return {"sessions": len(sessions), "files": files}

    async def _export_one(self, archive: _ZipWriter, session: Session) -> int:
        async with self.database.session() as db:
            data = await export_session(db, session)
        folder = f"sessions/{session.id}/"
        await archive.write_json(folder + "session.json", data)
        ref = SessionRef(session.org_id, session.user_id, session.id)
        stored = await self.transcripts.list_session(ref)
        prefix = session_prefix(ref)
        # The transcript's segments (and any legacy object) leave as one `transcript.jsonl`.
        parts = set(transcript_keys(ref, stored))
        others = [key for key in stored if key not in parts]
        for key in others:
            await archive.write(folder + key.removeprefix(prefix), await self.transcripts.read(key))
        transcript = await self.transcripts.read_transcript(ref) if parts else b""
        if transcript:
            await archive.write(folder + "transcript.jsonl", transcript)
        else:
            # The store is a mirror; the database is the record. Rebuild the transcript.
            await archive.write_lines(folder + "transcript.jsonl", data["messages"])
        return 2 + len(others)

    # --- users ------------------------------------------------------------------------------

    async def list_users(self) -> list[dict[str, Any]]:
        """Every user with their identities and session count."""
        async with self.database.session() as db:
            admin = AdminRepository(db)
            users = await admin.users()
            identities = _identity_records(await admin.identities_of([u.id for u in users]))
            counts = await admin.session_counts()
        return [_user_record(u, identities.get(u.id, []), counts.get(u.id, 0)) for u in users]

    async def show_user(self, user_id: str) -> dict[str, Any]:
        """One user with identities, session count and memory facts."""
        async with self.database.session() as db:
            user = await db.get(User, user_id)
            if user is None:
                raise NotFoundError(f"no user {user_id!r}")
            admin = AdminRepository(db)
            identities = _identity_records(await admin.identities_of([user_id])).get(user_id, [])
            count = await admin.session_count(user_id)
            facts = await MemoryRepository(db).facts(user_id)
        record = _user_record(user, identities, count)
        record["memory_facts"] = [{"key": f.fact_key, "fact": f.fact} for f in facts]
        return record

    async def link_identity(self, user_id: str, channel_type: str, external_id: str) -> None:
        """Link a channel identity (Slack `TEAM:USER`, AAD object id, email, web id) to a user."""
        if channel_type not in CHANNEL_TYPES:
            raise NotFoundError(f"no channel {channel_type!r} (one of {', '.join(CHANNEL_TYPES)})")
        external = sender_key(channel_type, external_id).partition(":")[2]
        async with self.database.session() as db:
            if await db.get(User, user_id) is None:
                raise NotFoundError(f"no user {user_id!r}")
            await UserRepository(db).link_identity(user_id, channel_type, external)
        log.info("admin.identity_linked", user_id=user_id, channel=channel_type)


async def _session(db: AsyncSession, session_id: str, *, for_update: bool = False) -> Session:
    session = await SessionRepository(db).get(session_id, for_update=for_update)
    if session is None:
        raise NotFoundError(f"no session {session_id!r}")
    return session


def _channel_records(
    channels: dict[str, list[SessionChannel]],
) -> dict[str, list[dict[str, Any]]]:
    return {
        session_id: [
            {
                "channel_type": channel.channel_type,
                "channel_id": channel.channel_id,
                "thread_id": channel.thread_id or None,
            }
            for channel in rows
        ]
        for session_id, rows in channels.items()
    }


def _identity_records(
    identities: dict[str, list[UserChannelIdentity]],
) -> dict[str, list[dict[str, str]]]:
    return {
        user_id: [{"channel_type": i.channel_type, "external_id": i.external_id} for i in rows]
        for user_id, rows in identities.items()
    }


def _user_record(user: User, identities: list[dict[str, str]], sessions: int) -> dict[str, Any]:
    return {
        "user_id": user.id,
        "org_id": user.org_id,
        "name": user.display_name,
        "admin": user.is_admin,
        "provisioned": user.provisioned,
        "created_at": user.created_at.isoformat(),
        "identities": identities,
        "session_count": sessions,
    }


def _json(data: object) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False, default=str)


class _ZipWriter:
    """A zip file built by one worker thread of its own, never on the event loop.

    Every step (opening, compressing each entry, closing) runs in that one thread in turn: the
    loop keeps serving meanwhile, and closing after a cancelled write waits for that write
    instead of racing it from a second thread.
    """

    def __init__(self, archive: zipfile.ZipFile, thread: ThreadPoolExecutor) -> None:
        self._archive = archive
        self._thread = thread

    async def write(self, name: str, data: bytes | str) -> None:
        """Add one entry."""
        await _in_thread(self._thread, self._archive.writestr, name, data)

    async def write_json(self, name: str, data: object) -> None:
        """Add one entry holding `data` as indented JSON (serialised in the thread too)."""
        await _in_thread(self._thread, self._write_json, name, data)

    async def write_lines(self, name: str, rows: Sequence[object]) -> None:
        """Add one JSON-lines entry, one row a line."""
        await _in_thread(self._thread, self._write_lines, name, rows)

    def _write_json(self, name: str, data: object) -> None:
        self._archive.writestr(name, _json(data))

    def _write_lines(self, name: str, rows: Sequence[object]) -> None:
        lines = io.StringIO()
        for row in rows:
            lines.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._archive.writestr(name, lines.getvalue().encode("utf-8"))


@asynccontextmanager
async def _zip_file(out: Path) -> AsyncIterator[_ZipWriter]:
    """A new zip file at `out` (its folder made), closed on the way out, as `ZipFile` is."""
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="export-zip")
    try:
        archive = await _in_thread(thread, _open_zip, out)
        try:
            yield _ZipWriter(archive, thread)
        finally:
            await _in_thread(thread, archive.close)
    finally:
        thread.shutdown(wait=False)


def _open_zip(out: Path) -> zipfile.ZipFile:
    out.parent.mkdir(parents=True, exist_ok=True)
    return zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED)


async def _in_thread(thread: ThreadPoolExecutor, work: Callable[..., T], *args: object) -> T:
    return await asyncio.get_running_loop().run_in_executor(thread, functools.partial(work, *args))
