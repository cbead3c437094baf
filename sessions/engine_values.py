"""What the session engine takes and gives: its settings, the tools the model may call, the
context a turn reads, and the messages a turn produces.

Frozen values only; `sessions.engine` owns the code that uses them. The gateway builds the
settings from config (`gateway.runtime_settings`), the turn (`sessions.turn`) stores what
`TurnOutcome` carries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sessions.compaction import CompactionPolicy
from sessions.context import AssembledContext, EarlierExcerpt, HistoryMessage
from sessions.llm import ContentBlock, ToolSpec
from sessions.memory import RetentionPolicy, SessionSummary
from sessions.recall_values import RecallExclusions, RecallOptions

ToolRunner = Callable[[Mapping[str, Any], str], Awaitable[str]]
"""Runs a tool for a user: (input, user id) → result text."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call, and the code that runs it."""

    spec: ToolSpec
    run: ToolRunner


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The config values the engine works with."""

    system_prompt: str
    max_tokens: int
    compaction: CompactionPolicy
    topic_every_messages: int = 5
    suggest_new_after: timedelta = timedelta(hours=8)
    summary_min_user_messages: int = 5
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)


@dataclass(frozen=True, slots=True)
class RecallSettings:
    """Recall in turns: passages of earlier conversations found for the latest user message
    are added to the system context (at most `auto_hits`, within `auto_context_tokens`, each
    the part of at most `excerpt_chars` about the message, `sessions.recall_excerpt`), and the
    model may call `search_past_conversations` (`tool`)."""

    auto_hits: int = 5
    auto_context_tokens: int = 600
    excerpt_chars: int = 400
    tool: bool = True
    options: RecallOptions = field(default_factory=RecallOptions)


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message the turn produced, to append to the session."""

    role: str
    content: str
    tokens: int
    blocks: tuple[ContentBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """What a turn produced: messages to append (the last one is the reply) and its cost."""

    messages: tuple[NewMessage, ...]
    reply_text: str
    input_tokens: int
    output_tokens: int
    context_tokens: int
    compacted: bool
    # The tools that ran in this turn (for the session's `skills_activated`).
    tools_used: tuple[str, ...] = ()
    # A tool call the turn asks the user to confirm (its reply is the question).
    confirmation: ToolRequest | None = None


@dataclass(frozen=True, slots=True)
class ContextReads:
    """What a turn's context is made of, as read from the database (and its caches)."""

    session_id: str
    user_id: str
    session_started: datetime
    org_name: str
    org_context: str
    facts: tuple[str, ...]
    recent: tuple[SessionSummary, ...]
    compaction_summary: str | None
    after_seq: int
    history: tuple[HistoryMessage, ...]
    thread_id: str = ""
    exclusions: RecallExclusions = field(default_factory=RecallExclusions)
    # Passages of earlier conversations recall found for the pending message.
    earlier: tuple[EarlierExcerpt, ...] = ()
    org_id: str = ""


@dataclass(frozen=True, slots=True)
class LoadedContext:
    """A turn's assembled context and the session facts read along with it."""

    context: AssembledContext
    messages_since_compaction: int
    session_started: datetime
    user_id: str
    recall_exclusions: RecallExclusions = field(default_factory=RecallExclusions)
    session_id: str = ""
    org_id: str = ""
    # The tools this user may use in this turn, by the name the model sees (the tools in
    # the request are these; a call of any other name is refused).
    offered_tools: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """A tool call waiting for the user's yes: which tool, with what input, until when."""

    tool_name: str
    tool_input: Mapping[str, Any]
    question: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class ConfirmedCall:
    """A confirmed tool call the turn runs before calling the model (None: the user did
    not confirm, and `notice` says why it was not run)."""

    request: ToolRequest
    confirmed: bool
    notice: str = ""
