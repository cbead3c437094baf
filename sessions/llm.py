"""The language-model boundary: request/response values, the `LLMClient` protocol, and the
offline provider that answers deterministically without any network.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Literal, Protocol

Role = Literal["user", "assistant"]

OFFLINE_LABEL = "[offline assistant: no language model is connected]"


@dataclass(frozen=True, slots=True)
class LLMMessage:
    """One message of the conversation as the model sees it."""

    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """Everything one model call needs."""

    system: str
    messages: tuple[LLMMessage, ...]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class LLMResponse:
    """The model's answer and what it cost."""

    text: str
    input_tokens: int
    output_tokens: int
    model: str


class LLMClient(Protocol):
    """A provider of completions (Anthropic, Bedrock, Vertex, or the offline one)."""

    name: str

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer the last user message of `request`; raise `LLMError` when that fails."""
        ...


def estimate_tokens(text: str) -> int:
    """A cheap local token estimate (about four characters a token for English text)."""
    return max(1, (len(text) + 3) // 4)


class OfflineLLM:
    """Deterministic answers with no network, clearly labelled, for development and tests.

    The reply quotes the user's last message and says how much conversation it was given, so
    a reader (or a test) can see that context and ordering are right. `latency` simulates a
    model's thinking time.
    """

    name = "offline"

    def __init__(self, *, latency: float = 0.0) -> None:
        self.latency = latency

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Echo the last user message with a short digest of the context."""
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        user_messages = [message for message in request.messages if message.role == "user"]
        last = user_messages[-1].content if user_messages else ""
        quoted = last if len(last) <= 400 else last[:400] + "…"
        digest = hashlib.sha256(
            "\n".join(f"{m.role}:{m.content}" for m in request.messages).encode()
        ).hexdigest()[:8]
        text = (
            f"{OFFLINE_LABEL} You said: «{quoted}». "
            f"I can see {len(request.messages) - 1} earlier message(s) in this conversation "
            f"(context {digest})."
        )
        input_tokens = estimate_tokens(request.system) + sum(
            estimate_tokens(message.content) for message in request.messages
        )
        return LLMResponse(
            text=text,
            input_tokens=input_tokens,
            output_tokens=estimate_tokens(text),
            model="offline",
        )
