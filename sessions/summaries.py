"""Session summaries: what an archived session was about, written by the leader's job for
sessions long enough to matter, with the memory facts found in them. Later sessions see the
recent summaries under "Recent conversations" and the facts in their system prompt."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import structlog

from sessions.compaction import as_history
from sessions.context import history_text
from sessions.llm import LLMClient
from sessions.memory import extract_facts, remember_facts, summarise_session
from storage.database import Database
from storage.models import SessionSummary as SessionSummaryRow
from storage.repositories.sessions import SessionRepository
from storage.repositories.summaries import SummaryRepository

log = structlog.stdlib.get_logger(__name__)


async def summarise_archived_sessions(
    database: Database,
    llm: LLMClient,
    *,
    min_user_messages: int,
    clock: Callable[[], datetime],
    on_written: Callable[[str], None],
    limit: int = 10,
) -> int:
    """Write summaries (and memory facts) for archived sessions with at least
    `min_user_messages` that lack one; `on_written(user_id)` after each. How many were."""
    async with database.session() as db:
        pending = await SummaryRepository(db).archived_without_summary(
            min_user_messages=min_user_messages, limit=limit
        )
    written = 0
    for session in pending:
        async with database.session() as db:
            rows = await SessionRepository(db).messages(session.id)
        transcript = history_text(as_history(rows))
        summary = await summarise_session(llm, transcript)
        facts = await extract_facts(llm, transcript)
        now = clock()
        async with database.session() as db:
            await SummaryRepository(db).add(
                SessionSummaryRow(
                    session_id=session.id,
                    user_id=session.user_id,
                    summary=summary,
                    topics=list(session.topics),
                    message_count=session.message_count,
                    created_at=now,
                )
            )
            await remember_facts(db, session.user_id, facts, source_session_id=session.id, at=now)
        on_written(session.user_id)
        log.info("session.summarised", session_id=session.id, facts=len(facts))
        written += 1
    return written
