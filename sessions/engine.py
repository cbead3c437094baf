"""The session engine: one assistant turn with the right context, and the bookkeeping around it.

`read_context` reads what the context is made of (recall's passages for the pending message
included) and `context_from` assembles it; `reply` compacts first when the history has grown
past the trigger, calls the model, runs any tools it asks for (a tool call and its result
always travel together), and returns the messages to append and the reply text, with any
notice (older messages summarised; time for `/new`) as part of that reply. It knows nothing
of channels. The values it takes and gives live in `sessions.engine_values`.

While it works, `reply` tells its `TurnProgress` what it is doing (compacting, thinking,
searching earlier conversations, running a tool) and streams the model's text into it; text
written before a tool call is not the answer, so the progress is reset before the tool runs.

Tools: the built-in ones (`search_past_conversations`) and, with a `McpToolbox`, the MCP
servers' tools this user's policy allows (`context_from` offers them; a call of any other name
is refused before it reaches a server). The calls of one model turn run side by side, for at
most the toolbox's `max_rounds` rounds; server results are fenced as data. A call of a tool
marked `confirm` is not run: the turn's reply asks the user (`TurnOutcome.confirmation`), and
the turn that gets the answer passes it in as `confirmed`.
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
from sqlalchemy.ext.asyncio import AsyncSession

from errors import LLMError, StorageError, ToolError
from sessions.compaction import Compactor
from sessions.context import (
    AssembledContext,
    ContextInputs,
    EarlierExcerpt,
    HistoryMessage,
    RecentConversation,
    assemble,
)
from sessions.context_cache import HistoryCache, MemoryCache, OrganizationCache
from sessions.engine_values import (
    ConfirmedCall,
    ContextReads,
    EngineSettings,
    LoadedContext,
    NewMessage,
    RecallSettings,
    Tool,
    ToolRequest,
    TurnOutcome,
)
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
from sessions.memory import SessionSummary
from sessions.progress import NO_PROGRESS, NoProgress, TurnProgress
from sessions.recall import RecallExclusions, RecallSearch
from sessions.recall_tool import SEARCH_TOOL, SEARCH_TOOL_NAME, run_search_tool
from sessions.summaries import summarise_archived_sessions
from sessions.toolbox import TOOL_DATA_NOTE, McpToolbox, fenced
from sessions.topics import TopicWriter
from storage.database import Database
from storage.models import Session as SessionRow
from storage.recall_vectors import TextEmbedder, VectorIndex
from storage.repositories.sessions import SessionRepository

log = structlog.stdlib.get_logger(__name__)

COMPACTION_NOTICE = "(Older messages of this conversation were summarised to make room.)"
SUGGEST_NEW_NOTICE = "(This conversation has been going on for a while: send /new to start fresh.)"
MAX_TOOL_ROUNDS = 8
"""Model ↔ tool round trips in one turn without a toolbox (the toolbox's `max_rounds` else)."""
CONFIRM_PENDING_RESULT = (
    "Not run yet: the user is asked to confirm this call, and answers in their next message."
)
MAX_MEMORY_FACTS = 50


class SessionEngine:
    """Runs turns and the session bookkeeping (compaction, topics, summaries, memory)."""

    def __init__(
        self,
        database: Database,
        compactor: Compactor,
        llm: LLMClient,
        settings: EngineSettings,
        *,
        clock: Callable[[], datetime],
        tools: tuple[Tool, ...] = (),
        recall: RecallSettings | None = None,
        toolbox: McpToolbox | None = None,
        embedder: TextEmbedder | None = None,
    ) -> None:
        self.database = database
        # Dense recall's model (None: not installed) and the users' vectors read so far.
        self.embedder = embedder
        self.vectors = VectorIndex(embedder) if embedder is not None else None
        self.compactor = compactor
        self.llm = llm
        self.settings = settings
        self.clock = clock
        self.extra_tools = tools
        # The MCP servers' tools, offered by the user's policy (None: only the built-in ones).
        self.toolbox = toolbox
        self.recall_settings: RecallSettings | None = None
        self.recall: RecallSearch | None = None
        self.tools: dict[str, Tool] = {}
        self._set_recall(recall)
        self.tokens = TokenEstimator()
        # What a turn reads of the database that rarely changes, kept between turns and
        # checked against the rows that say when it changed (`sessions.context_cache`).
        self.histories = HistoryCache()
        self.organizations = OrganizationCache()
        self.memories = MemoryCache(
            MAX_MEMORY_FACTS, self.settings.retention.hot_limit, self.settings.retention
        )
        self.topics = TopicWriter(
            database, llm, self.histories, every=settings.topic_every_messages
        )

    def reconfigure(self, settings: EngineSettings, recall: RecallSettings | None) -> None:
        """Apply reloaded settings to the next turn: the prompt and answer length, the history
        budget and compaction policy, topics, summaries and recall (None: off)."""
        self.settings = settings
        self.compactor.policy = settings.compaction
        self.topics.every = settings.topic_every_messages
        self._set_recall(recall)

    def _set_recall(self, recall: RecallSettings | None) -> None:
        current = self.recall_settings
        dense = recall is not None and recall.options.dense and self.embedder is not None
        # Vectors are written while dense recall is on (`gateway recall reindex` fills in what
        # was written while it was off).
        self.database.use_embedder(self.embedder if dense else None)
        if recall is None or current is None or recall.options != current.options:
            self.recall = (
                RecallSearch(self.database, recall.options, vectors=self.vectors if dense else None)
                if recall
                else None
            )
        self.recall_settings = recall
        tools = self.extra_tools
        if recall is not None and recall.tool:
            tools = (Tool(SEARCH_TOOL, self._search_past_conversations), *tools)
        self.tools = {tool.spec.name: tool for tool in tools}

    async def read_context(
        self,
        db: AsyncSession,
        session: SessionRow,
        *,
        thread_id: str = "",
        pending: HistoryMessage | None = None,
    ) -> ContextReads:
        """What the session's next turn's context is made of, read in the caller's
        transaction, recall's search included (in a savepoint: a failed search only leaves
        the passages out); `context_from` assembles it.

        `pending` is the user message the turn answers, not stored yet (the turn stores it
        with the answer): it is the last message of the history and the recall query.
        """
        now = self.clock()
        history = await self.histories.read(db, session)
        organization = await self.organizations.get(db, session.org_id)
        facts, summaries = await self.memories.read(db, session.user_id, now)
        hot = self.settings.retention.select(
            [
                SessionSummary(s.session_id, s.summary, s.created_at)
                for s in summaries
                if s.session_id != session.id
            ],
            now,
        )
        history_rows = (*history.messages, *((pending,) if pending is not None else ()))
        exclusions = RecallExclusions(
            session_id=session.id,
            after_seq=history.after_seq,
            summary_sessions=frozenset(s.session_id for s in hot),
        )
        earlier = await self._recall_earlier(session.user_id, history_rows, exclusions, db=db)
        return ContextReads(
            session_id=session.id,
            user_id=session.user_id,
            session_started=session.created_at,
            org_name=organization.name if organization else session.org_id,
            org_context=organization.context if organization else "",
            facts=facts,
            recent=tuple(hot),
            compaction_summary=history.summary,
            after_seq=history.after_seq,
            history=history_rows,
            thread_id=thread_id,
            exclusions=exclusions,
            earlier=earlier,
            org_id=session.org_id,
        )

    def context_from(self, reads: ContextReads) -> LoadedContext:
        """The assembled context of `reads`."""
        offered = self.toolbox.offered(reads.org_id, reads.user_id) if self.toolbox else ()
        system_prompt = self.settings.system_prompt
        if offered:
            system_prompt = f"{system_prompt}\n\n{TOOL_DATA_NOTE}"
        specs = (*(tool.spec for tool in self.tools.values()), *(tool.spec for tool in offered))
        inputs = ContextInputs(
            system_prompt=system_prompt,
            org_name=reads.org_name,
            org_context=reads.org_context,
            memory_facts=list(reads.facts),
            recent_conversations=[
                RecentConversation(s.session_id, s.created_at, s.summary) for s in reads.recent
            ],
            compaction_summary=reads.compaction_summary,
            history=reads.history,
            thread_id=reads.thread_id,
            earlier_conversations=reads.earlier,
        )
        context = assemble(
            inputs,
            budget_tokens=self.settings.compaction.budget_tokens,
            max_tokens=self.settings.max_tokens,
            tools=specs,
        )
        return LoadedContext(
            context,
            len(reads.history),
            reads.session_started,
            reads.user_id,
            reads.exclusions,
            reads.session_id,
            org_id=reads.org_id,
            offered_tools=frozenset(spec.name for spec in specs),
        )

    async def load_context(
        self, session_id: str, *, thread_id: str = "", pending: HistoryMessage | None = None
    ) -> LoadedContext:
        """The context of the session's next turn, read in a transaction of its own."""
        async with self.database.session() as db:
            session = await SessionRepository(db).get(session_id)
            if session is None:
                raise StorageError("the session does not exist", key=session_id)
            reads = await self.read_context(db, session, thread_id=thread_id, pending=pending)
        return self.context_from(reads)

    async def reply(
        self,
        loaded: LoadedContext,
        *,
        thread_id: str = "",
        pending: HistoryMessage | None = None,
        progress: TurnProgress = NO_PROGRESS,
        confirmed: ConfirmedCall | None = None,
    ) -> TurnOutcome:
        """Answer the turn whose context is `loaded`; raises `LLMError` if the model fails.

        `confirmed`: the user answered a question "Run X?" with this message. A yes runs the
        call first (as a call and result of its own after the user's message), then the
        model answers; otherwise its notice (cancelled, expired) ends the reply.

        Compacts first (PreCompact archive, then the summary) when the history has grown past
        the trigger, and reads the context again after it. `progress` hears what the turn is
        doing and the answer's text as the model writes it (the reply text returned is the
        authoritative one: it also carries the notices).
        """
        context = loaded.context
        policy = self.settings.compaction
        compacted = False
        if policy.needed(
            self.tokens.estimate(context.history_tokens), loaded.messages_since_compaction
        ):
            progress.status("compacting")
            compacted = await self.compactor.compact(loaded.session_id) is not None
            if compacted:
                self.memories.forget(loaded.user_id)  # compaction may have written facts
                context = (
                    await self.load_context(loaded.session_id, thread_id=thread_id, pending=pending)
                ).context
        if context.dropped_messages:
            # Only when compaction could not run and the history is over the whole budget.
            log.warning(
                "context.messages_left_out",
                session_id=loaded.session_id,
                count=context.dropped_messages,
            )
        rounds = _ToolRounds()
        request = context.request
        if confirmed is not None and confirmed.confirmed:
            request = await self._run_confirmed(
                confirmed.request, request, loaded, rounds, progress
            )
        response = await self._call_with_tools(request, loaded, rounds, progress)
        notices = [COMPACTION_NOTICE] if compacted else []
        if confirmed is not None and confirmed.notice:
            notices.append(confirmed.notice)
        if self.clock() - loaded.session_started > self.settings.suggest_new_after:
            notices.append(SUGGEST_NEW_NOTICE)
        blocks: tuple[ContentBlock, ...] = ()
        if rounds.confirmation is not None:
            reply, output = rounds.confirmation.question, 0
        else:
            assert response is not None
            reply = response.text.strip() or "(no answer)"
            output, blocks = response.output_tokens, response.blocks
        if notices:
            reply = f"{reply}\n\n" + "\n".join(notices)
        final = NewMessage("assistant", reply, output or estimate_tokens(reply), blocks)
        return TurnOutcome(
            messages=(*rounds.messages, final),
            reply_text=reply,
            input_tokens=rounds.input_tokens,
            output_tokens=rounds.output_tokens,
            context_tokens=rounds.context_tokens,
            compacted=compacted,
            tools_used=tuple(dict.fromkeys(rounds.used)),
            confirmation=rounds.confirmation,
        )

    async def assemble_context(
        self, session_id: str, thread_id: str = ""
    ) -> tuple[AssembledContext, int]:
        """The context of the next turn, and how many messages came since the last compaction."""
        loaded = await self.load_context(session_id, thread_id=thread_id)
        return loaded.context, loaded.messages_since_compaction

    async def _recall_earlier(
        self,
        user_id: str,
        rows: Sequence[HistoryMessage],
        exclusions: RecallExclusions,
        db: AsyncSession | None = None,
    ) -> tuple[EarlierExcerpt, ...]:
        """Passages of earlier conversations for the latest user message, within the cap.

        Recall only adds to a turn: when the search fails, the turn goes on without it.
        """
        settings = self.recall_settings
        if self.recall is None or settings is None or settings.auto_hits < 1:
            return ()
        query = next((r.content for r in reversed(rows) if r.role == "user"), "")
        if not query.strip():
            return ()
        try:
            hits = await self.recall.search(
                user_id, query, settings.auto_hits, exclude=exclusions, db=db
            )
        except StorageError as exc:
            log.warning("recall.failed", user_id=user_id, error=str(exc))
            return ()
        excerpts: list[EarlierExcerpt] = []
        used = 0
        for hit in hits:
            text = " ".join(hit.text.split())
            if len(text) > settings.excerpt_chars:
                text = text[: settings.excerpt_chars - 1].rstrip() + "…"
            excerpt = EarlierExcerpt(hit.session_id, hit.date, hit.speaker, text)
            cost = estimate_tokens(excerpt.line())
            if used + cost > settings.auto_context_tokens:
                break
            excerpts.append(excerpt)
            used += cost
        if excerpts:
            log.info("recall.added_to_context", count=len(excerpts), tokens=used)
        return tuple(excerpts)

    async def _search_past_conversations(self, tool_input: Mapping[str, Any], user_id: str) -> str:
        """The tool outside a turn (nothing to exclude); inside one, `_run_tool` passes what
        is already in the context."""
        if self.recall is None:
            raise LookupError("recall is not enabled")
        return await run_search_tool(self.recall, tool_input, user_id)

    @property
    def max_tool_rounds(self) -> int:
        """Model ↔ tool round trips a turn may take."""
        return self.toolbox.settings.max_rounds if self.toolbox else MAX_TOOL_ROUNDS

    async def _call_with_tools(
        self,
        request: LLMRequest,
        loaded: LoadedContext,
        rounds: _ToolRounds,
        progress: TurnProgress,
    ) -> LLMResponse | None:
        """The model's final response after its tool rounds (None: a tool call waits for the
        user's confirmation, and the turn's reply is the question)."""
        # Nobody watching (no progress, or one that only finishes an earlier live message):
        # the plain call, not a stream.
        streaming = None if isinstance(progress, NoProgress) else progress
        max_rounds = self.max_tool_rounds
        for round_number in range(max_rounds + 1):
            raw = request_estimate(request)
            progress.status("thinking")
            response = await self.llm.complete(request, progress=streaming)
            self.tokens.observe(raw, response.input_tokens)
            rounds.input_tokens += response.input_tokens
            rounds.output_tokens += response.output_tokens
            rounds.context_tokens = response.input_tokens
            if response.stop_reason != "tool_use" or not response.tool_calls:
                return response
            if round_number == max_rounds:
                break  # its calls are not run: the rounds are used up
            # What the model wrote before asking for tools is not the answer.
            progress.reset()
            for call in response.tool_calls:
                _announce_tool(progress, str(call.get("name")))
            # The calls of one model turn run side by side; results keep the calls' order,
            # and so does the list of the tools used (not the order they finished in).
            before = len(rounds.used)
            results = list(
                await asyncio.gather(
                    *(self._run_tool(call, loaded, rounds) for call in response.tool_calls)
                )
            )
            ran = set(rounds.used[before:])
            rounds.used[before:] = [
                name for call in response.tool_calls if (name := str(call.get("name"))) in ran
            ]
            call_message = NewMessage(
                "assistant", response.text, response.output_tokens, response.blocks
            )
            rounds.messages += [call_message, _result_message(results)]
            if rounds.confirmation is not None:
                return None
            request = _with_messages(
                request,
                LLMMessage("assistant", response.blocks),
                LLMMessage("user", tuple(results)),
            )
        raise LLMError(f"the model kept calling tools after {max_rounds} rounds")

    async def _run_confirmed(
        self,
        confirmed: ToolRequest,
        request: LLMRequest,
        loaded: LoadedContext,
        rounds: _ToolRounds,
        progress: TurnProgress,
    ) -> LLMRequest:
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
        _announce_tool(progress, confirmed.tool_name)
        result = await self._call_mcp(call, loaded, rounds, confirmed=True)
        rounds.messages += [
            NewMessage("assistant", text, estimate_tokens(text), blocks),
            _result_message([result]),
        ]
        return _with_messages(
            request, LLMMessage("assistant", blocks), LLMMessage("user", (result,))
        )

    async def _run_tool(
        self, call: ContentBlock, loaded: LoadedContext, rounds: _ToolRounds
    ) -> ContentBlock:
        name = str(call.get("name"))
        result: ContentBlock = {"type": "tool_result", "tool_use_id": call.get("id")}
        if name not in loaded.offered_tools:
            # The model named a tool it was not offered (made up, or outside the policy).
            log.warning("tools.refused", tool=name, user_id=loaded.user_id)
            return {**result, "content": f"unknown tool {name!r}", "is_error": True}
        tool = self.tools.get(name)
        if tool is None:
            return await self._call_mcp(call, loaded, rounds)
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
        rounds.used.append(name)
        return {**result, "content": output}

    async def _call_mcp(
        self,
        call: ContentBlock,
        loaded: LoadedContext,
        rounds: _ToolRounds,
        *,
        confirmed: bool = False,
    ) -> ContentBlock:
        """A server's tool: asked about first when it needs the user's yes (unless this is
        the confirmed call), else run within its timeout; the result fenced as data."""
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
            if rounds.confirmation is not None:
                return {
                    **result,
                    "content": "Not run: the user confirms one call at a time; ask again later.",
                    "is_error": True,
                }
            rounds.confirmation = ToolRequest(
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
        rounds.used.append(name)
        block: ContentBlock = {**result, "content": fenced(name, outcome.text)}
        if outcome.is_error:
            block["is_error"] = True
        return block

    async def summarise_archived_sessions(self, *, limit: int = 10) -> int:
        """Write summaries (and memory facts) for archived sessions that lack one."""
        return await summarise_archived_sessions(
            self.database,
            self.llm,
            min_user_messages=self.settings.summary_min_user_messages,
            clock=self.clock,
            on_written=self.memories.forget,
            limit=limit,
        )


@dataclass
class _ToolRounds:
    """What a turn's tool rounds have produced so far."""

    messages: list[NewMessage] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    context_tokens: int = 0
    used: list[str] = field(default_factory=list)
    confirmation: ToolRequest | None = None


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
