"""The session's topic, refreshed every few messages: written from the latest messages,
taken from the cached history or, when that copy is not at the turn's point (another
process answered), read from the database."""

from __future__ import annotations

from sessions.context_cache import HistoryCache
from sessions.llm import LLMRequest, LLMResponse
from sessions.topics import TOPIC_MESSAGES, TopicWriter
from storage.database import Database
from storage.repositories.sessions import SessionRepository
from tests.sessions.test_context_cache import new_session, store

TOPIC = '{"summary": "Planning the Acme renewal.", "topics": ["acme", "renewal", "pricing"]}'


class TopicModel:
    """Answers every request with `TOPIC` and keeps the requests."""

    def __init__(self) -> None:
        self.requests: list[LLMRequest] = []

    async def complete(self, request: LLMRequest, **_: object) -> LLMResponse:
        self.requests.append(request)
        return LLMResponse(TOPIC, input_tokens=1, output_tokens=1, model="topic")


async def test_a_topic_read_from_the_database_is_written_from_the_latest_messages(
    database: Database,
) -> None:
    session_id = await new_session(database)
    await store(database, session_id, *(f"message {n}" for n in range(1, 41)))
    model = TopicModel()
    writer = TopicWriter(database, model, HistoryCache(), every=5)  # the cache holds nothing

    assert await writer.update_if_due(session_id, first_seq=39, last_seq=40) == (
        "Planning the Acme renewal."
    )
    (request,) = model.requests
    transcript = request.messages[0].content
    kept = [n for n in range(1, 41) if f"message {n}\n" in transcript + "\n"]
    assert kept == list(range(41 - TOPIC_MESSAGES, 41))
    async with database.session() as db:
        session = await SessionRepository(db).get(session_id)
    assert session is not None
    assert (session.topic_summary, session.topics) == (
        "Planning the Acme renewal.",
        ["acme", "renewal", "pricing"],
    )
