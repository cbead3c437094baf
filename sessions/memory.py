"""What the assistant remembers across sessions: summaries of past sessions and durable facts.

Facts (preferences, names, commitments) are extracted by the model from compacted or archived
conversations and deduplicated by a normalised key. Session summaries are written when a
session is archived; a `RetentionPolicy` picks which of them a new turn sees as "Recent
conversations".
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from sessions.llm import LLMClient, LLMMessage, LLMRequest
from storage.repositories.memory import MemoryRepository

FACT_CATEGORIES = frozenset({"preference", "identity", "commitment", "fact"})

FACTS_SYSTEM = (
    "Extract durable facts about the user from the conversation: preferences, names, roles, "
    "commitments and decisions that will still matter in later conversations. Answer with a "
    'JSON array only, like [{"category": "preference", "fact": "Prefers short answers."}], '
    "categories: preference, identity, commitment, fact. Answer [] when there are none."
)
SESSION_SUMMARY_SYSTEM = (
    "Summarise this conversation in 2 to 5 sentences for the assistant's future reference: "
    "decisions made, work in progress, and what the user intends to do next. Plain text only."
)


@dataclass(frozen=True, slots=True)
class MemoryFact:
    """A durable fact about a user."""

    category: str
    fact: str

    @property
    def key(self) -> str:
        """The deduplication key: the fact's words, lower-cased, without punctuation."""
        words = re.findall(r"[\w']+", self.fact.lower())
        return hashlib.sha256(" ".join(words).encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """The summary of an archived session."""

    session_id: str
    summary: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Which past-session summaries stay "hot" (always in context): the newest `hot_limit`
    written within `hot_window_days`."""

    hot_limit: int = 3
    hot_window_days: int = 14

    def cutoff(self, now: datetime) -> datetime:
        """Summaries older than this are no longer hot."""
        return now - timedelta(days=self.hot_window_days)

    def select(self, summaries: list[SessionSummary], now: datetime) -> list[SessionSummary]:
        """The hot summaries, newest first."""
        hot = [s for s in summaries if s.created_at >= self.cutoff(now)]
        return sorted(hot, key=lambda s: s.created_at, reverse=True)[: self.hot_limit]


async def remember_facts(
    db: AsyncSession,
    user_id: str,
    facts: Sequence[MemoryFact],
    *,
    source_session_id: str,
    at: datetime,
) -> int:
    """Store new facts in the user's memory (known ones are skipped); how many were new."""
    memory = MemoryRepository(db)
    new = 0
    for fact in facts:
        new += await memory.remember(
            user_id,
            fact_key=fact.key,
            fact=fact.fact,
            category=fact.category,
            source_session_id=source_session_id,
            at=at,
        )
    return new


def transcript_prompt(transcript: str, previous_summary: str | None = None) -> str:
    """The user message of a bookkeeping call: the earlier summary and the transcript."""
    parts = []
    if previous_summary:
        parts.append(f"<previous_summary>\n{previous_summary}\n</previous_summary>")
    parts.append(f"<transcript>\n{transcript}\n</transcript>")
    return "\n\n".join(parts)


def parse_facts(text: str) -> list[MemoryFact]:
    """The facts in a model's JSON answer; anything unparseable yields no facts."""
    match = re.search(r"\[.*\]", text, re.S)
    if match is None:
        return []
    try:
        items = json.loads(match.group(0))
    except json.JSONDecodeError:
        return []
    facts = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("fact"), str):
            continue
        fact = " ".join(item["fact"].split())[:500]
        category = item.get("category") if item.get("category") in FACT_CATEGORIES else "fact"
        if fact:
            facts.append(MemoryFact(str(category), fact))
    return facts


async def extract_facts(llm: LLMClient, transcript: str) -> list[MemoryFact]:
    """Ask the model for the durable facts in `transcript`, deduplicated."""
    response = await llm.complete(
        LLMRequest(
            system=FACTS_SYSTEM,
            messages=(LLMMessage("user", transcript_prompt(transcript)),),
            max_tokens=1024,
            purpose="facts",
        )
    )
    unique: dict[str, MemoryFact] = {}
    for fact in parse_facts(response.text):
        unique.setdefault(fact.key, fact)
    return list(unique.values())


async def summarise_session(llm: LLMClient, transcript: str) -> str:
    """A 2-5 sentence summary of a whole session."""
    response = await llm.complete(
        LLMRequest(
            system=SESSION_SUMMARY_SYSTEM,
            messages=(LLMMessage("user", transcript_prompt(transcript)),),
            max_tokens=512,
            purpose="session_summary",
        )
    )
    return response.text.strip()
