"""Context assembly: what the model sees on a turn, within the history token budget.

The system prompt (with the organization's context) comes first; then as many of the newest
messages as fit in `history_budget_tokens`, oldest first, starting with a user message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sessions.llm import LLMMessage, LLMRequest, Role, estimate_tokens


@dataclass(frozen=True, slots=True)
class HistoryMessage:
    """A stored message as context assembly needs it."""

    role: Role
    content: str
    tokens: int = 0

    @property
    def cost(self) -> int:
        """Its token cost: the stored count, or a local estimate when none was stored."""
        return self.tokens or estimate_tokens(self.content)


def system_prompt_for(system_prompt: str, org_name: str, org_context: str) -> str:
    """The system prompt with the user's organization described after it."""
    if not org_context.strip():
        return system_prompt
    return f"{system_prompt}\n\nThe user works at {org_name}. {org_context.strip()}"


def assemble_request(
    *,
    system: str,
    history: Sequence[HistoryMessage],
    budget_tokens: int,
    max_tokens: int,
) -> LLMRequest:
    """The newest messages that fit the budget, oldest first, never starting on a reply."""
    chosen: list[HistoryMessage] = []
    used = 0
    for message in reversed(history):
        if chosen and used + message.cost > budget_tokens:
            break
        chosen.append(message)
        used += message.cost
    chosen.reverse()
    while len(chosen) > 1 and chosen[0].role != "user":
        chosen.pop(0)
    return LLMRequest(
        system=system,
        messages=tuple(LLMMessage(message.role, message.content) for message in chosen),
        max_tokens=max_tokens,
    )
