"""The language-model boundary: request/response values, the `LLMClient` protocol, and the
offline provider that answers deterministically without any network.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sessions.progress import TurnProgress

Role = Literal["user", "assistant"]
ContentBlock = dict[str, Any]
"""One Messages API content block (`text`, `tool_use`, `tool_result` …), kept exactly as sent."""

Purpose = Literal["reply", "compaction_summary", "facts", "topic", "session_summary"]
"""Why a call is made: a reply to the user, or one of the engine's bookkeeping calls."""

OFFLINE_LABEL = "[offline assistant: no language model is connected]"


@dataclass(frozen=True, slots=True)
class LLMMessage:
    """One message of the conversation as the model sees it: text, or content blocks."""

    role: Role
    content: str | tuple[ContentBlock, ...]

    @property
    def text(self) -> str:
        """The message's text (text blocks joined; tool blocks described briefly)."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(block_text(block) for block in self.content)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: name, description and JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """Everything one model call needs."""

    system: str
    messages: tuple[LLMMessage, ...]
    max_tokens: int
    purpose: Purpose = "reply"
    tools: tuple[ToolSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class LLMResponse:
    """The model's answer, its raw content blocks, why it stopped, and what it cost."""

    text: str
    input_tokens: int
    output_tokens: int
    model: str
    blocks: tuple[ContentBlock, ...] = ()
    stop_reason: str = "end_turn"

    @property
    def tool_calls(self) -> tuple[ContentBlock, ...]:
        """The `tool_use` blocks the model asked to run."""
        return tuple(block for block in self.blocks if block.get("type") == "tool_use")


def block_text(block: ContentBlock) -> str:
    """A content block as plain text (for token estimates, summaries and the offline model)."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "tool_use":
        return f"[tool call {block.get('name')}: {block.get('input')}]"
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            content = " ".join(str(item.get("text", "")) for item in content)
        return f"[tool result: {content}]"
    return f"[{kind}]"


class LLMClient(Protocol):
    """A provider of completions (Anthropic, Bedrock, Vertex, or the offline one)."""

    name: str

    async def complete(
        self, request: LLMRequest, *, progress: TurnProgress | None = None
    ) -> LLMResponse:
        """Answer the last user message of `request`; raise `LLMError` when that fails.

        With `progress`, the answer streams: each piece of text goes to `progress.text` as
        the model writes it, and `progress.reset` says the text so far was dropped (a call
        retried after a stream broke off). The response is the same either way.
        """
        ...

    async def close(self) -> None:
        """Release connections (at shutdown)."""
        ...


def estimate_tokens(text: str) -> int:
    """A cheap local token estimate (about four characters a token for English text)."""
    return max(1, (len(text) + 3) // 4)


_WORD_START = re.compile(r"(?<=\s)(?=\S)")


def word_tokens(text: str) -> list[str]:
    """`text` cut before each word, whitespace kept: the pieces a fake model streams, which
    join back into `text` exactly."""
    return [piece for piece in _WORD_START.split(text) if piece]


class OfflineLLM:
    """Deterministic answers with no network, clearly labelled, for development and tests.

    A reply quotes the user's last message and says how much conversation it was given, so a
    reader (or a test) can see that context and ordering are right. The engine's bookkeeping
    calls (summaries, facts, topics) get simple extractive answers in the format the engine
    asks of a real model.

    It paces itself like a model that streams: `latency` is the time before the first word,
    `token_interval` the time between two words. A call with `progress` streams the answer
    word by word; one without waits as long and returns it whole, as a real model would.
    """

    name = "offline"

    def __init__(self, *, latency: float = 0.0, token_interval: float = 0.0) -> None:
        self.latency = latency
        self.token_interval = token_interval

    async def close(self) -> None:
        """Nothing to release."""

    async def complete(
        self, request: LLMRequest, *, progress: TurnProgress | None = None
    ) -> LLMResponse:
        """Answer `request` according to its purpose (streamed into `progress` if given)."""
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        text = self._answer(request)
        await self._write(text, progress)
        input_tokens = estimate_tokens(request.system) + sum(
            estimate_tokens(message.text) for message in request.messages
        )
        return LLMResponse(
            text=text,
            input_tokens=input_tokens,
            output_tokens=estimate_tokens(text),
            model="offline",
            blocks=({"type": "text", "text": text},),
        )

    async def _write(self, text: str, progress: TurnProgress | None) -> None:
        """Take the time writing `text` takes at `token_interval`, word by word into
        `progress` when someone watches."""
        words = word_tokens(text)
        if progress is None:
            if self.token_interval > 0 and len(words) > 1:
                await asyncio.sleep(self.token_interval * (len(words) - 1))
            return
        for index, word in enumerate(words):
            if index and self.token_interval > 0:
                await asyncio.sleep(self.token_interval)
            progress.text(word)

    def _answer(self, request: LLMRequest) -> str:
        last = request.messages[-1].text if request.messages else ""
        match request.purpose:
            case "reply":
                return self._reply(request)
            case "compaction_summary" | "session_summary":
                return offline_summary(last, max_chars=request.max_tokens * 4)
            case "facts":
                return json.dumps(offline_facts(last))
            case "topic":
                return json.dumps(offline_topic(last))

    @staticmethod
    def _reply(request: LLMRequest) -> str:
        user_messages = [m for m in request.messages if m.role == "user"]
        last = user_messages[-1].text if user_messages else ""
        quoted = last if len(last) <= 400 else last[:400] + "…"
        digest = hashlib.sha256(
            "\n".join(f"{m.role}:{m.text}" for m in request.messages).encode()
        ).hexdigest()[:8]
        return (
            f"{OFFLINE_LABEL} You said: «{quoted}». "
            f"I can see {len(request.messages) - 1} earlier message(s) in this conversation "
            f"(context {digest})."
        )


_TAG = re.compile(r"<(?P<tag>previous_summary|transcript)>\n?(?P<body>.*?)\n?</(?P=tag)>", re.S)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_FACT_CUES = {
    "preference": re.compile(
        r"\b(i (really )?(prefer|like|love|hate|dislike|want)|my favou?rite)\b", re.I
    ),
    "identity": re.compile(r"\b(my name is|call me|i am|i'm|i work|i live)\b", re.I),
    "commitment": re.compile(
        r"\b(we decided|we agreed|i will|deadline|due on|remember that)\b", re.I
    ),
}
_STOPWORDS = frozenset(
    [
        "about",
        "after",
        "again",
        "also",
        "been",
        "before",
        "being",
        "could",
        "does",
        "doing",
        "from",
        "have",
        "here",
        "into",
        "just",
        "like",
        "make",
        "more",
        "most",
        "much",
        "need",
        "only",
        "over",
        "please",
        "really",
        "said",
        "should",
        "some",
        "than",
        "that",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "thing",
        "this",
        "those",
        "very",
        "want",
        "what",
        "when",
        "where",
        "which",
        "while",
        "will",
        "with",
        "would",
        "your",
        "yours",
        "you're",
        "i'm",
        "it's",
        "that's",
    ]
)


def tagged_sections(text: str) -> dict[str, str]:
    """The `<previous_summary>` and `<transcript>` sections of a bookkeeping prompt."""
    return {match["tag"]: match["body"] for match in _TAG.finditer(text)}


def _user_lines(transcript: str) -> list[str]:
    return [line[len("user: ") :] for line in transcript.splitlines() if line.startswith("user: ")]


def offline_summary(prompt: str, *, max_chars: int) -> str:
    """An extractive summary: the previous summary's points, then each user message's first
    sentence, without repeats, cut at `max_chars`."""
    sections = tagged_sections(prompt)
    points = [
        line[2:]
        for line in sections.get("previous_summary", "").splitlines()
        if line.startswith("- ")
    ]
    for line in _user_lines(sections.get("transcript", prompt)):
        first = _SENTENCE.split(line.strip(), maxsplit=1)[0][:200]
        if first and first not in points:
            points.append(first)
    text = ""
    for point in points:
        if len(text) + len(point) + 3 > max_chars:
            break
        text += f"- {point}\n"
    return text.rstrip() or "- (nothing of note)"


def offline_facts(prompt: str) -> list[dict[str, str]]:
    """Durable facts the user stated: sentences with a preference, identity or commitment cue."""
    facts: list[dict[str, str]] = []
    for line in _user_lines(tagged_sections(prompt).get("transcript", prompt)):
        for sentence in _SENTENCE.split(line.strip()):
            for category, cue in _FACT_CUES.items():
                if cue.search(sentence):
                    facts.append({"category": category, "fact": sentence.strip()[:300]})
                    break
    return facts


def offline_topic(prompt: str) -> dict[str, object]:
    """A one-sentence topic (the first user message's first sentence) and frequent keywords."""
    lines = _user_lines(tagged_sections(prompt).get("transcript", prompt))
    counts: dict[str, int] = {}
    for line in lines:
        for word in re.findall(r"[a-zA-Z][a-zA-Z'-]{3,}", line.lower()):
            if word not in _STOPWORDS:
                counts[word] = counts.get(word, 0) + 1
    keywords = sorted(counts, key=lambda word: (-counts[word], word))[:5]
    summary = _SENTENCE.split(lines[0].strip(), maxsplit=1)[0][:160] if lines else ""
    return {"summary": summary, "topics": keywords}


class TokenEstimator:
    """Local token estimates, calibrated by what the API reports it actually counted."""

    def __init__(self) -> None:
        self.ratio = 1.0

    def estimate(self, raw_estimate: int) -> int:
        """A calibrated estimate."""
        return int(raw_estimate * self.ratio)

    def observe(self, raw_estimate: int, actual: int) -> None:
        """Move the ratio towards the observed one (a slow moving average)."""
        if raw_estimate > 0 and actual > 0:
            observed = min(max(actual / raw_estimate, 0.25), 4.0)
            self.ratio = 0.8 * self.ratio + 0.2 * observed


def request_estimate(request: LLMRequest) -> int:
    """The local estimate of a request's input tokens."""
    return estimate_tokens(request.system) + sum(
        estimate_tokens(message.text) for message in request.messages
    )
