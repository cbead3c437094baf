"""The session engine: one assistant turn with the right context, and the bookkeeping around it.

`read_context` reads what the context is made of in the caller's transaction, `with_earlier`
adds recall's passages for the pending message after it (searched in transactions of their
own), and `context_from` assembles it; `reply` compacts first when the history has grown
past the trigger, then calls the model with its tool rounds (`sessions.tool_rounds`), and
returns the messages to append and the reply text, with any notice (older messages
summarised; time for `/new`) as part of that reply. It knows nothing of channels. The values it
takes and gives live in `sessions.engine_values`.

While it works, `reply` tells its `TurnProgress` what it is doing (compacting; the tool rounds
tell it the rest) and the model's text streams into it.

Tools: the built-in ones (`search_past_conversations`) and, with a `McpToolbox`, the MCP
servers' tools this user's policy allows (`context_from` offers them). A call of a tool marked
`confirm` is not run: the turn's reply asks the user (`TurnOutcome.confirmation`), and the turn
that gets the answer passes it in as `confirmed`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from errors import StorageError
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
    TurnOutcome,
)
from sessions.llm import (
    ContentBlock,
    LLMClient,
    TokenEstimator,
    estimate_tokens,
)
from sessions.progress import NO_PROGRESS, TurnProgress
from sessions.recall import RecallSearch
from sessions.recall_excerpt import excerpt, question_words
from sessions.recall_tool import SEARCH_TOOL, run_search_tool
from sessions.recall_values import RecallExclusions
from sessions.summaries import summarise_archived_sessions
from sessions.tool_rounds import ToolRounds
from sessions.toolbox import TOOL_DATA_NOTE, McpToolbox
from sessions.topics import TopicWriter
from storage.database import Database
from storage.recall_vectors import TextEmbedder
from storage.repositories.session_state import SessionState, read_state
from storage.vector_index import VectorIndex

log = structlog.stdlib.get_logger(__name__)

COMPACTION_NOTICE = "(Older messages of this conversation were summarised to make room.)"
SUGGEST_NEW_NOTICE = "(This conversation has been going on for a while: send /new to start fresh.)"
MAX_TOOL_ROUNDS = 8
"""Model ↔ tool round trips in one turn without a toolbox (the toolbox's `max_rounds` else)."""
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
        session: SessionState,
        *,
        thread_id: str = "",
        pending: HistoryMessage | None = None,
    ) -> ContextReads:
        """What the session's next turn's context is made of, read in the caller's
        transaction; recall's passages are not searched here (`with_earlier`, once the
        transaction has ended); `context_from` assembles it.

        `pending` is the user message the turn answers, not stored yet (the turn stores it
        with the answer): it is the last message of the history and the recall query.
        """
        now = self.clock()
        history = await self.histories.read(db, session)
        organization = await self.organizations.get(db, session.org_id)
        facts, summaries = await self.memories.read(db, session.user_id, now)
        hot = self.settings.retention.select(
            [summary for summary in summaries if summary.session_id != session.id], now
        )
        history_rows = (*history.messages, *((pending,) if pending is not None else ()))
        others_indexed = session.others_indexed
        search = self._turn_search()
        if others_indexed is None and history.after_seq == 0 and search is not None:
            # Here, in the transaction that reads, rather than by the search in one of its own.
            others_indexed = await search.others_indexed(db, session.user_id, session.id)
        exclusions = RecallExclusions(
            session_id=session.id,
            after_seq=history.after_seq,
            summary_sessions=frozenset(s.session_id for s in hot),
            others_indexed=others_indexed,
        )
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
        """The context of the session's next turn, read as a turn reads it
        (`Database.lookups`: on PostgreSQL without a transaction, each read seeing what was
        committed; on SQLite without the write lock): the state's numbers bound what the
        history holds, and the session's appends wait for its user's turn lock."""
        async with self.database.lookups() as db:
            session = await read_state(db, session_id)
            if session is None:
                raise StorageError("the session does not exist", key=session_id)
            reads = await self.read_context(db, session, thread_id=thread_id, pending=pending)
        return self.context_from(await self.with_earlier(reads))

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
        rounds = ToolRounds(
            self.llm,
            self.tokens,
            loaded,
            progress,
            self.clock,
            max_rounds=self.toolbox.settings.max_rounds if self.toolbox else MAX_TOOL_ROUNDS,
            tools=self.tools,
            toolbox=self.toolbox,
            recall=self.recall,
        )
        request = context.request
        if confirmed is not None and confirmed.confirmed:
            request = await rounds.run_confirmed(confirmed.request, request)
        response = await rounds.call(request)
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

    async def with_earlier(self, reads: ContextReads) -> ContextReads:
        """`reads` with recall's passages of earlier conversations for the latest user
        message, within the cap. Called after the transaction of `read_context` has ended:
        the search reads in transactions of its own, so a turn holds neither its routing
        transaction nor, on SQLite, the write lock while it searches. Recall only adds to a
        turn: when the search fails, the turn goes on without it."""
        earlier = await self._recall_earlier(reads.user_id, reads.history, reads.exclusions)
        return dataclasses.replace(reads, earlier=earlier) if earlier else reads

    def _turn_search(self) -> RecallSearch | None:
        """Recall's search when it runs for every turn's message (`with_earlier`)."""
        settings = self.recall_settings
        return self.recall if settings is not None and settings.auto_hits >= 1 else None

    async def _recall_earlier(
        self, user_id: str, rows: Sequence[HistoryMessage], exclusions: RecallExclusions
    ) -> tuple[EarlierExcerpt, ...]:
        settings, search = self.recall_settings, self._turn_search()
        if search is None or settings is None:
            return ()
        query = next((r.content for r in reversed(rows) if r.role == "user"), "")
        if not query.strip():
            return ()
        try:
            hits = await search.search(user_id, query, settings.auto_hits, exclude=exclusions)
        except StorageError as exc:
            log.warning("recall.failed", user_id=user_id, error=str(exc))
            return ()
        if not hits:
            return ()
        excerpts: list[EarlierExcerpt] = []
        used = 0
        words = question_words(query)
        for hit in hits:
            text = excerpt(hit.text, words, settings.excerpt_chars)
            earlier = EarlierExcerpt(hit.session_id, hit.date, hit.speaker, text)
            cost = estimate_tokens(earlier.line())
            if used + cost > settings.auto_context_tokens:
                break
            excerpts.append(earlier)
            used += cost
        if excerpts:
            log.info("recall.added_to_context", count=len(excerpts), tokens=used)
        return tuple(excerpts)

    async def _search_past_conversations(self, tool_input: Mapping[str, Any], user_id: str) -> str:
        """The tool outside a turn (nothing to exclude); inside one, `ToolRounds` passes what
        is already in the context."""
        if self.recall is None:
            raise LookupError("recall is not enabled")
        return await run_search_tool(self.recall, tool_input, user_id)

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
