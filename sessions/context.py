"""Context assembly: what the model sees on a turn, within `history_budget_tokens`.

In order: the system prompt with the organization's context, what is known about the user
(memory facts), "Recent conversations" (summaries of the user's last sessions), "From
earlier conversations" (passages recall found for the latest message); then, as
messages, the latest compaction summary as an assistant `<summary>` block, and the messages
since that compaction. When the turn is in a thread, the thread's messages come first in the
budget and the rest of the session fills what is left, so a reply in a thread knows both.

Only what is sent is read and counted: the messages since the last compaction (a bounded
number, because compaction keeps it so), never the whole session.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sessions.llm import ContentBlock, LLMMessage, LLMRequest, ToolSpec, block_text, estimate_tokens

EARLIER_HEADING = (
    "From earlier conversations (passages found by searching them for the user's latest "
    "message; they may be incomplete or unrelated):"
)
SUMMARY_LEAD_IN = "(Our conversation so far is summarised below; older messages are archived.)"


@dataclass(frozen=True, slots=True)
class HistoryMessage:
    """A stored message as context assembly needs it.

    `role` is `user`, `assistant` or `tool` (a tool result, sent with the user role);
    `blocks` are the exact content blocks of tool calls and results, when there are any.
    """

    seq: int
    role: str
    content: str
    tokens: int = 0
    thread_id: str = ""
    blocks: tuple[ContentBlock, ...] = ()

    @property
    def cost(self) -> int:
        """Its token cost: the stored count, or a local estimate when none was stored."""
        return self.tokens or estimate_tokens(self.content)

    def to_llm(self) -> LLMMessage:
        """The message as the API takes it."""
        content = self.blocks if self.blocks else self.content
        if self.role == "assistant":
            return LLMMessage("assistant", content)
        return LLMMessage("user", content)


@dataclass(frozen=True, slots=True)
class RecentConversation:
    """A summary of one of the user's earlier sessions."""

    session_id: str
    ended: datetime
    summary: str


@dataclass(frozen=True, slots=True)
class EarlierExcerpt:
    """A passage of an earlier conversation found by recall, shown under "From earlier
    conversations"; `speaker` is empty for a summary."""

    session_id: str
    date: datetime
    speaker: str
    text: str

    def line(self) -> str:
        """The excerpt as one line of the system prompt."""
        who = self.speaker or "summary"
        return f"- {self.date:%Y-%m-%d} {who} (session {self.session_id[:8]}): {self.text}"


@dataclass(frozen=True, slots=True)
class ContextInputs:
    """Everything assembly draws on, already loaded."""

    system_prompt: str
    org_name: str
    org_context: str
    memory_facts: Sequence[str]
    recent_conversations: Sequence[RecentConversation]
    compaction_summary: str | None
    history: Sequence[HistoryMessage]
    thread_id: str = ""
    earlier_conversations: Sequence[EarlierExcerpt] = ()


@dataclass(frozen=True, slots=True)
class AssembledContext:
    """The request to send and how full the history budget is."""

    request: LLMRequest
    history_tokens: int
    dropped_messages: int


def system_prompt_for(system_prompt: str, org_name: str, org_context: str) -> str:
    """The system prompt with the user's organization described after it."""
    if not org_context.strip():
        return system_prompt
    return f"{system_prompt}\n\nThe user works at {org_name}. {org_context.strip()}"


def build_system(inputs: ContextInputs) -> str:
    """System prompt, organization, memory facts, recent conversations and passages from
    earlier conversations, in that order."""
    parts = [system_prompt_for(inputs.system_prompt, inputs.org_name, inputs.org_context)]
    if inputs.memory_facts:
        parts.append(
            "What you know about the user:\n" + "\n".join(f"- {f}" for f in inputs.memory_facts)
        )
    if inputs.recent_conversations:
        lines = [
            f"- {item.ended:%Y-%m-%d} (session {item.session_id[:8]}): {item.summary}"
            for item in inputs.recent_conversations
        ]
        parts.append("Recent conversations:\n" + "\n".join(lines))
    if inputs.earlier_conversations:
        parts.append(
            f"{EARLIER_HEADING}\n" + "\n".join(item.line() for item in inputs.earlier_conversations)
        )
    return "\n\n".join(parts)


def choose_history(
    history: Sequence[HistoryMessage], budget_tokens: int, thread_id: str = ""
) -> list[HistoryMessage]:
    """The messages that fit the budget: the thread's first (when in a thread), then the
    newest others; in sequence order; never starting on an answer or a tool result (so a tool
    call is never separated from its result). The latest message is always kept."""
    if not history:
        return []
    latest = history[-1]
    chosen = {latest.seq}
    used = latest.cost
    in_thread = [m for m in history[:-1] if thread_id and m.thread_id == thread_id]
    others = [m for m in history[:-1] if not (thread_id and m.thread_id == thread_id)]
    for group in (in_thread, others):
        for message in reversed(group):
            if used + message.cost > budget_tokens:
                break
            chosen.add(message.seq)
            used += message.cost
    kept = [m for m in history if m.seq in chosen]
    while len(kept) > 1 and kept[0].role != "user":
        kept.pop(0)
    return kept


def assemble(
    inputs: ContextInputs,
    *,
    budget_tokens: int,
    max_tokens: int,
    tools: tuple[ToolSpec, ...] = (),
) -> AssembledContext:
    """The request for this turn and the number of history tokens it carries."""
    summary_messages: list[LLMMessage] = []
    summary_tokens = 0
    if inputs.compaction_summary:
        block = f"<summary>\n{inputs.compaction_summary}\n</summary>"
        summary_messages = [LLMMessage("user", SUMMARY_LEAD_IN), LLMMessage("assistant", block)]
        summary_tokens = estimate_tokens(block) + estimate_tokens(SUMMARY_LEAD_IN)
    kept = choose_history(inputs.history, max(budget_tokens - summary_tokens, 0), inputs.thread_id)
    messages = (*summary_messages, *(m.to_llm() for m in kept))
    return AssembledContext(
        request=LLMRequest(
            system=build_system(inputs),
            messages=messages,
            max_tokens=max_tokens,
            tools=tools,
        ),
        history_tokens=summary_tokens + sum(m.cost for m in kept),
        dropped_messages=len(inputs.history) - len(kept),
    )


def history_text(messages: Sequence[HistoryMessage]) -> str:
    """Messages as `role: text` lines, for summary and extraction prompts."""
    lines = []
    for message in messages:
        text = (
            " ".join(block_text(b) for b in message.blocks) if message.blocks else message.content
        )
        lines.append(f"{message.role}: {' '.join(text.split())}")
    return "\n".join(lines)
