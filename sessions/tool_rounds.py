"""One turn's model calls and tool rounds.

The model answers, or asks for tools; the calls of one model turn run side by side (their
results keep the calls' order), and the model is asked again with the results, for at most
`max_rounds` rounds. A tool call and its result always travel together, and both are kept as
messages of the turn. Built-in tools (`search_past_conversations`) run here; the MCP
servers' tools through the `McpToolbox`, only those this user's policy offers (a call of any
other name is refused before it reaches a server) and with their results fenced as data. A
call of a tool marked `confirm` is not run: the turn's reply asks the user (`confirmation`),
and the turn that gets the yes runs it first (`run_confirmed`).

While it works, the progress hears what runs (searching, a tool's name) and the model's text
as it streams; text written before a tool call is not the answer, so the progress is reset
before the tool runs.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog

from errors import LLMError, StorageError, ToolError
from sessions.engine_values import LoadedContext, NewMessage, Tool, ToolRequest
from sessions.llm import (
    ContentBlock,
    LLMClient,
    LLMMessage,
    LLMRequest,
    LLMResponse,
    TokenEstimator,
    estimate_tokens,
    request_estimate,
)
from sessions.progress import NoProgress, TurnProgress
from sessions.recall import RecallSearch
from sessions.recall_tool import SEARCH_TOOL_NAME, run_search_tool
from sessions.toolbox import McpToolbox, fenced

log = structlog.stdlib.get_logger(__name__)

CONFIRM_PENDING_RESULT = (
    "Not run yet: the user is asked to confirm this call, and answers in their next message."
)


@dataclass
class ToolRounds:
    """One turn's model calls and tool rounds, and what they produced so far."""

    llm: LLMClient
    tokens: TokenEstimator
    loaded: LoadedContext
    progress: TurnProgress
    clock: Callable[[], datetime]
    max_rounds: int
    tools: Mapping[str, Tool] = field(default_factory=dict)
    toolbox: McpToolbox | None = None
    recall: RecallSearch | None = None
    messages: list[NewMessage] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    context_tokens: int = 0
    used: list[str] = field(default_factory=list)
    confirmation: ToolRequest | None = None

    async def call(self, request: LLMRequest) -> LLMResponse | None:
        """The model's final response after its tool rounds (None: a tool call waits for the
        user's confirmation, and the turn's reply is the question)."""
        progress = self.progress
        # Nobody watching (no progress, or one that only finishes an earlier live message):
        # the plain call, not a stream.
        streaming = None if isinstance(progress, NoProgress) else progress
        for round_number in range(self.max_rounds + 1):
            raw = request_estimate(request)
            progress.status("thinking")
            response = await self.llm.complete(request, progress=streaming)
            self.tokens.observe(raw, response.input_tokens)
            self.input_tokens += response.input_tokens
            self.output_tokens += response.output_tokens
            self.context_tokens = response.input_tokens
            if response.stop_reason != "tool_use" or not response.tool_calls:
                return response
            if round_number == self.max_rounds:
                break  # its calls are not run: the rounds are used up
            # What the model wrote before asking for tools is not the answer.
            progress.reset()
            for call in response.tool_calls:
                _announce_tool(progress, str(call.get("name")))
            # The calls of one model turn run side by side; results keep the calls' order,
            # and so does the list of the tools used (not the order they finished in).
            before = len(self.used)
            results = list(
                await asyncio.gather(*(self._run_tool(call) for call in response.tool_calls))
            )
            ran = set(self.used[before:])
            self.used[before:] = [
                name for call in response.tool_calls if (name := str(call.get("name"))) in ran
            ]
            call_message = NewMessage(
                "assistant", response.text, response.output_tokens, response.blocks
            )
            self.messages += [call_message, _result_message(results)]
            if self.confirmation is not None:
                return None
            request = _with_messages(
                request,
                LLMMessage("assistant", response.blocks),
                LLMMessage("user", tuple(results)),
            )
        raise LLMError(f"the model kept calling tools after {self.max_rounds} rounds")

    async def run_confirmed(self, confirmed: ToolRequest, request: LLMRequest) -> LLMRequest:
        """Run the call the user confirmed, recorded as a call of its own after the user's
        yes; the request with the call and its result added."""
        call: ContentBlock = {
            "type": "tool_use",
            "id": f"toolu_confirmed_{uuid.uuid4().hex[:16]}",
            "name": confirmed.tool_name,
            "input": dict(confirmed.tool_input),
        }
        text = f"Running `{confirmed.tool_name}`, as the user confirmed."
        blocks: tuple[ContentBlock, ...] = ({"type": "text", "text": text}, call)
        _announce_tool(self.progress, confirmed.tool_name)
        result = await self._call_mcp(call, confirmed=True)
        self.messages += [
            NewMessage("assistant", text, estimate_tokens(text), blocks),
            _result_message([result]),
        ]
        return _with_messages(
            request, LLMMessage("assistant", blocks), LLMMessage("user", (result,))
        )

    async def _run_tool(self, call: ContentBlock) -> ContentBlock:
        loaded = self.loaded
        name = str(call.get("name"))
        result: ContentBlock = {"type": "tool_result", "tool_use_id": call.get("id")}
        if name not in loaded.offered_tools:
            # The model named a tool it was not offered (made up, or outside the policy).
            log.warning("tools.refused", tool=name, user_id=loaded.user_id)
            return {**result, "content": f"unknown tool {name!r}", "is_error": True}
        tool = self.tools.get(name)
        if tool is None:
            return await self._call_mcp(call)
        try:
            if name == SEARCH_TOOL_NAME and self.recall is not None:
                output = await run_search_tool(
                    self.recall,
                    call.get("input") or {},
                    loaded.user_id,
                    exclude=loaded.recall_exclusions,
                )
            else:
                output = await tool.run(call.get("input") or {}, loaded.user_id)
        except (ValueError, LookupError, StorageError) as exc:
            log.warning("tool.failed", tool=name, error=str(exc))
            return {**result, "content": f"the tool failed: {exc}", "is_error": True}
        log.info("tool.ran", tool=name)
        self.used.append(name)
        return {**result, "content": output}

    async def _call_mcp(self, call: ContentBlock, *, confirmed: bool = False) -> ContentBlock:
        """A server's tool: asked about first when it needs the user's yes (unless this is
        the confirmed call), else run within its timeout; the result fenced as data."""
        loaded = self.loaded
        name = str(call.get("name"))
        result: ContentBlock = {"type": "tool_result", "tool_use_id": call.get("id")}
        tool_input = call.get("input")
        arguments = dict(tool_input) if isinstance(tool_input, Mapping) else {}
        toolbox = self.toolbox
        offered = toolbox.find(name, loaded.org_id, loaded.user_id) if toolbox else None
        if toolbox is None or offered is None:
            log.warning("tools.refused", tool=name, user_id=loaded.user_id)
            return {**result, "content": f"the tool {name!r} is not available", "is_error": True}
        if offered.tool.confirm and not confirmed:
            if self.confirmation is not None:
                return {
                    **result,
                    "content": "Not run: the user confirms one call at a time; ask again later.",
                    "is_error": True,
                }
            self.confirmation = ToolRequest(
                tool_name=name,
                tool_input=arguments,
                question=confirmation_question(name, arguments),
                expires_at=self.clock() + toolbox.settings.confirm_within,
            )
            log.info("tools.confirmation_asked", tool=name)
            return {**result, "content": CONFIRM_PENDING_RESULT}
        try:
            outcome = await toolbox.call(
                name, arguments, org_id=loaded.org_id, user_id=loaded.user_id
            )
        except ToolError as exc:
            log.warning("tool.failed", tool=name, error=str(exc))
            return {**result, "content": f"the tool failed: {exc}", "is_error": True}
        self.used.append(name)
        block: ContentBlock = {**result, "content": fenced(name, outcome.text)}
        if outcome.is_error:
            block["is_error"] = True
        return block


def confirmation_question(name: str, arguments: Mapping[str, Any]) -> str:
    """What the user is asked before a call that needs their yes."""
    shown = json.dumps(dict(arguments), ensure_ascii=False, sort_keys=True)
    if len(shown) > 600:
        shown = shown[:599] + "…"
    return f"Run `{name}` with {shown}? Reply yes or no."


def _result_message(results: Sequence[ContentBlock]) -> NewMessage:
    tokens = sum(estimate_tokens(str(result.get("content"))) for result in results)
    return NewMessage("tool", "", tokens, tuple(results))


def _with_messages(request: LLMRequest, *messages: LLMMessage) -> LLMRequest:
    return LLMRequest(
        system=request.system,
        messages=(*request.messages, *messages),
        max_tokens=request.max_tokens,
        tools=request.tools,
    )


def _announce_tool(progress: TurnProgress, name: str) -> None:
    """Say which tool runs: the earlier-conversations search has a status of its own."""
    if name == SEARCH_TOOL_NAME:
        progress.status("searching")
    else:
        progress.status("tool", name)
