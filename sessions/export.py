"""A session's export: its metadata, channels, messages and compactions, as plain JSON data.

The same shape serves the user's `/export` download and the admin CLI. An export is a copy:
the session keeps its state.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import Session
from storage.repositories.compactions import CompactionRepository
from storage.repositories.sessions import SessionRepository


def session_record(session: Session) -> dict[str, Any]:
    """The session's metadata."""
    return {
        "session_id": session.id,
        "user_id": session.user_id,
        "status": session.status,
        "message_count": session.message_count,
        "compaction_count": session.compaction_count,
        "created_at": session.created_at.isoformat(),
        "last_active": session.last_active_at.isoformat(),
        "topic_summary": session.topic_summary,
        "topics": list(session.topics),
        "skills_activated": list(session.skills_activated),
        "input_tokens": session.input_tokens,
        "output_tokens": session.output_tokens,
    }


async def export_session(db: AsyncSession, session: Session) -> dict[str, Any]:
    """Everything stored about one session, oldest message first."""
    sessions = SessionRepository(db)
    channels = await sessions.channels(session.id)
    messages = await sessions.messages(session.id)
    compactions = await CompactionRepository(db).all_of(session.id)
    return {
        **session_record(session),
        "channels": [
            {
                "channel_type": c.channel_type,
                "channel_id": c.channel_id,
                "thread_id": c.thread_id or None,
            }
            for c in channels
        ],
        "messages": [
            {
                "seq": m.seq,
                "role": m.role,
                "channel": m.channel_type,
                "thread_id": m.thread_id or None,
                "content": m.content,
                "created_at": m.created_at.isoformat(),
                **({"blocks": m.metadata_json["blocks"]} if m.metadata_json.get("blocks") else {}),
                # The files that came with it (their bytes are under `files/` in the export).
                **({"files": m.metadata_json["files"]} if m.metadata_json.get("files") else {}),
            }
            for m in messages
        ],
        "compactions": [
            {
                "seq": c.seq,
                "messages_compacted": c.messages_compacted,
                "tokens_before": c.tokens_before,
                "tokens_after": c.tokens_after,
                "archive_ref": c.archive_ref,
                "summary": c.summary,
            }
            for c in compactions
        ],
    }
