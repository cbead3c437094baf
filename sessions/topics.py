"""Session topics: the one-sentence summary and keywords `/sessions` shows, refreshed by the
model every few messages from the latest ones."""

from __future__ import annotations

import json

import structlog

from sessions.compaction import as_history
from sessions.context import history_text
from sessions.context_cache import HistoryCache
from sessions.llm import LLMClient, LLMMessage, LLMRequest
from storage.database import Database
from storage.repositories.sessions import history_messages, set_topic

log = structlog.stdlib.get_logger(__name__)

TOPIC_MESSAGES = 30  # the latest messages a topic is written from
TOPIC_SYSTEM = (
    "Describe the topic of this conversation. Answer with JSON only: "
    '{"summary": "<one sentence>", "topics": ["<3 to 5 keywords>"]}'
)


class TopicWriter:
    """Refreshes a session's topic when a turn passes a multiple of `every` messages."""

    def __init__(
        self, database: Database, llm: LLMClient, histories: HistoryCache, *, every: int
    ) -> None:
        self.database = database
        self.llm = llm
        self.histories = histories
        self.every = every

    async def update_if_due(self, session_id: str, *, first_seq: int, last_seq: int) -> str | None:
        """Refresh the topic when the turn, which stored the session's messages `first_seq`
        to `last_seq`, passed a multiple of `every`; the new topic when it was written."""
        if last_seq // self.every == (first_seq - 1) // self.every:
            return None
        # The turn just extended the cached history; the database only when it is not there.
        recent = self.histories.recent(session_id, through_seq=last_seq, count=TOPIC_MESSAGES)
        if recent is None:
            async with self.database.session() as db:
                rows = await history_messages(
                    db,
                    session_id,
                    after_seq=max(last_seq - TOPIC_MESSAGES, 0),
                    through_seq=last_seq,
                )
            recent = tuple(as_history(rows))
        response = await self.llm.complete(
            LLMRequest(
                system=TOPIC_SYSTEM,
                messages=(
                    LLMMessage("user", f"<transcript>\n{history_text(recent)}\n</transcript>"),
                ),
                max_tokens=200,
                purpose="topic",
            )
        )
        summary, topics = parse_topic(response.text)
        if not summary:
            return None
        async with self.database.statement(writes=True) as scope:  # no BEGIN and COMMIT
            await set_topic(scope, session_id, summary, topics)
        log.info("session.topic_updated", session_id=session_id, topics=topics)
        return summary


def parse_topic(text: str) -> tuple[str, list[str]]:
    """The summary sentence and keywords of a topic answer (empty when unparseable)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return "", []
    try:
        data = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return "", []
    if not isinstance(data, dict):
        return "", []
    summary = " ".join(str(data.get("summary", "")).split())[:300]
    topics = [str(t)[:40] for t in data.get("topics", []) if isinstance(t, str)][:5]
    return summary, topics
