"""Compaction: older messages leave the model's context, replaced by a summary, never lost.

One recoverable operation, in this order (the session is `compacting` meanwhile):

a. PreCompact: the full transcript (every message since the session began, tool blocks
   included) is written to `archive/full_transcript_pre_compact_NNN.jsonl` and verified. If
   that fails, nothing else happens: the session goes back to `active`, its context is
   untouched, and the next turn tries again.
b. One model call summarises the messages being compacted, folding in the previous summary.
c. Durable facts are extracted into the user's memory, deduplicated.
d. The compaction is recorded (database row and `compact_NNN.json`); the last
   `keep_last_messages` stay verbatim. Messages stay in the database; only the context shrinks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import structlog

from errors import ArchiveExistsError, LLMError, StorageError
from sessions.context import HistoryMessage, history_text
from sessions.lifecycle import transition
from sessions.llm import LLMClient, LLMMessage, LLMRequest, estimate_tokens
from sessions.memory import MemoryFact, extract_facts, remember_facts, transcript_prompt
from storage.database import Database
from storage.models import Session, SessionCompaction, SessionMessage, SessionStatus
from storage.repositories.compactions import CompactionRepository
from storage.repositories.sessions import SessionRepository, StoredMessage
from storage.transcripts import (
    SessionRef,
    TranscriptLine,
    TranscriptStore,
    compaction_key,
    encode_lines,
    parse_transcript,
    pre_compact_archive_key,
)

log = structlog.stdlib.get_logger(__name__)

SUMMARY_SYSTEM = (
    "Summarise the conversation below so it can replace the messages in the assistant's "
    "context. Keep every key decision, action item, user preference, fact learned and open "
    "question, as short bullet points starting with '- '. Name every file the user sent "
    "(shown as <file name=...> or [File ...]) with a line on what it held, so it can be "
    "asked about later. When a previous summary is given, fold it in: nothing from it may "
    "be lost. Stay within {limit} tokens."
)


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When to compact and how much to keep."""

    budget_tokens: int
    trigger_ratio: float = 0.8
    max_messages: int = 200
    keep_last_messages: int = 20
    summary_max_tokens: int = 2000

    @property
    def summary_limit(self) -> int:
        """Tokens the summary may take: never more than a quarter of the budget."""
        return max(1, min(self.summary_max_tokens, self.budget_tokens // 4))

    @property
    def max_kept_tokens(self) -> int:
        """Tokens the verbatim messages may keep after compaction: half of the trigger level,
        so that summary and kept messages together leave room for many more turns."""
        return max(1, int(self.trigger_ratio * self.budget_tokens / 2))

    def needed(self, history_tokens: int, messages_since_compaction: int) -> bool:
        """Whether the context has grown past the trigger."""
        return (
            history_tokens > self.trigger_ratio * self.budget_tokens
            or messages_since_compaction > self.max_messages
        )


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What one compaction did."""

    seq: int
    messages_compacted: int
    first_message_seq: int
    last_message_seq: int
    tokens_before: int
    tokens_after: int
    archive_ref: str
    summary: str
    facts: tuple[MemoryFact, ...]


def as_history(rows: Sequence[SessionMessage | StoredMessage]) -> list[HistoryMessage]:
    """Stored messages as context assembly takes them."""
    return [
        HistoryMessage(
            seq=row.seq,
            role=row.role,
            content=row.content,
            tokens=row.tokens,
            thread_id=row.thread_id,
            blocks=tuple(row.metadata_json.get("blocks", ())),
        )
        for row in rows
    ]


def transcript_line(
    *,
    seq: int,
    message_id: str | None,
    role: str,
    channel: str,
    thread_id: str,
    content: str,
    metadata: Mapping[str, Any],
    at: datetime,
    tokens: int,
) -> TranscriptLine:
    """A stored message as a transcript line; tool blocks are kept as their JSON."""
    blocks = metadata.get("blocks")
    return TranscriptLine(
        msg_id=message_id or f"seq-{seq}",
        role=role,
        channel=channel,
        thread_id=thread_id or None,
        content=json.dumps(blocks) if blocks else content,
        timestamp=at,
        tokens=tokens,
    )


def transcript_lines(rows: Sequence[SessionMessage]) -> list[TranscriptLine]:
    """Stored messages as transcript lines."""
    return [
        transcript_line(
            seq=row.seq,
            message_id=row.message_id,
            role=row.role,
            channel=row.channel_type,
            thread_id=row.thread_id,
            content=row.content,
            metadata=row.metadata_json,
            at=row.created_at,
            tokens=row.tokens,
        )
        for row in rows
    ]


def split_point(history: Sequence[HistoryMessage], keep_last: int, max_kept_tokens: int) -> int:
    """How many of `history` to compact.

    All but the last `keep_last` messages, and fewer kept when those alone would take more
    than `max_kept_tokens` (else the next turn would be over the trigger again and compaction
    would repeat every turn). The kept part always starts with a user message, so a tool call
    is never separated from its result.
    """
    cut = max(len(history) - keep_last, 0)
    while cut < len(history) - 1 and sum(m.cost for m in history[cut:]) > max_kept_tokens:
        cut += 1
    user_starts = [index for index, message in enumerate(history) if message.role == "user"]
    earlier = [index for index in user_starts if 0 < index <= cut]
    if earlier and sum(m.cost for m in history[earlier[-1] :]) <= max_kept_tokens:
        return earlier[-1]  # keep a little more rather than start on an answer
    later = [index for index in user_starts if index >= cut]
    if later:
        return later[0]
    return earlier[-1] if earlier else 0


class Compactor:
    """Runs compactions of one gateway's sessions."""

    def __init__(
        self,
        database: Database,
        transcripts: TranscriptStore,
        llm: LLMClient,
        policy: CompactionPolicy,
        *,
        clock: Callable[[], datetime],
        on_archive_failed: Callable[[], None] | None = None,
    ) -> None:
        self.database = database
        self.transcripts = transcripts
        self.llm = llm
        self.policy = policy
        self.clock = clock
        self.on_archive_failed = on_archive_failed or (lambda: None)

    async def compact(self, session_id: str) -> CompactionResult | None:
        """Compact the session; None when there was nothing to do or it had to wait."""
        async with self.database.session() as db:
            session = await SessionRepository(db).get(session_id, for_update=True)
            if session is None:
                return None
            previous = await CompactionRepository(db).latest(session_id)
            rows = await SessionRepository(db).messages(session_id)
            if not self._has_work(previous, rows):
                _back(session, self.clock())  # also ends a compaction a crash cut short
                return None
            if session.status == SessionStatus.ACTIVE.value:
                transition(session, SessionStatus.COMPACTING, at=self.clock(), reason="budget")
            ref = SessionRef(session.org_id, session.user_id, session.id)
            number = session.compaction_count + 1
        try:
            result = await self._run(ref, number, previous, rows)
        except (StorageError, LLMError) as exc:
            log.warning("compaction.deferred", session_id=session_id, error=str(exc))
            if isinstance(exc, StorageError):
                self.on_archive_failed()
            await self._back_to_active(session_id)
            return None
        if result is None:
            await self._back_to_active(session_id)
        return result

    def _has_work(self, previous: SessionCompaction | None, rows: Sequence[SessionMessage]) -> bool:
        since = [r for r in rows if previous is None or r.seq > previous.last_message_seq]
        history = as_history(since)
        return split_point(history, self.policy.keep_last_messages, self.policy.max_kept_tokens) > 0

    async def _run(
        self,
        ref: SessionRef,
        number: int,
        previous: SessionCompaction | None,
        rows: Sequence[SessionMessage],
    ) -> CompactionResult | None:
        since = [r for r in rows if previous is None or r.seq > previous.last_message_seq]
        history = as_history(since)
        cut = split_point(history, self.policy.keep_last_messages, self.policy.max_kept_tokens)
        if cut == 0:
            return None
        compacted, kept = history[:cut], history[cut:]

        archive_ref = await self._archive(ref, number, rows, last_needed_seq=compacted[-1].seq)
        log.info("compaction.archived", session_id=ref.session_id, archive=archive_ref)

        previous_summary = previous.summary if previous else None
        summary_response = await self.llm.complete(
            LLMRequest(
                system=SUMMARY_SYSTEM.format(limit=self.policy.summary_limit),
                messages=(
                    LLMMessage(
                        "user", transcript_prompt(history_text(compacted), previous_summary)
                    ),
                ),
                max_tokens=self.policy.summary_limit,
                purpose="compaction_summary",
            )
        )
        summary = summary_response.text.strip()
        try:
            facts = tuple(await extract_facts(self.llm, history_text(compacted)))
        except LLMError as exc:
            log.warning("compaction.facts_failed", session_id=ref.session_id, error=str(exc))
            facts = ()

        tokens_before = sum(m.cost for m in history) + (
            estimate_tokens(previous_summary) if previous_summary else 0
        )
        result = CompactionResult(
            seq=number,
            messages_compacted=len(compacted),
            first_message_seq=compacted[0].seq,
            last_message_seq=compacted[-1].seq,
            tokens_before=tokens_before,
            tokens_after=estimate_tokens(summary) + sum(m.cost for m in kept),
            archive_ref=archive_ref,
            summary=summary,
            facts=facts,
        )
        await self._write_record(ref, result)
        await self._commit(ref, result)
        log.info(
            "session.compacted",
            session_id=ref.session_id,
            compaction=number,
            messages_compacted=result.messages_compacted,
            tokens_before=result.tokens_before,
            tokens_after=result.tokens_after,
            facts=len(facts),
        )
        return result

    async def _archive(
        self, ref: SessionRef, number: int, rows: Sequence[SessionMessage], *, last_needed_seq: int
    ) -> str:
        key = pre_compact_archive_key(ref, number)
        data = encode_lines(transcript_lines(rows))
        try:
            stored = await self.transcripts.write_archive(key, data)
        except ArchiveExistsError:
            # A crashed earlier attempt wrote it; it will do if it holds every message that is
            # about to leave the context.
            existing = parse_transcript(await self.transcripts.read(key))
            if len(existing) < last_needed_seq:
                raise
            log.info("compaction.archive_reused", session_id=ref.session_id, key=key)
            return key
        written = await self.transcripts.stat(key)
        lines = parse_transcript(await self.transcripts.read(key))
        if written is None or written.size != stored.size or len(lines) != len(rows):
            raise StorageError("the pre-compact archive did not verify", key=key)
        return key

    async def _write_record(self, ref: SessionRef, result: CompactionResult) -> None:
        record = asdict(result)
        record["facts"] = [asdict(fact) for fact in result.facts]
        try:
            await self.transcripts.write_archive(
                compaction_key(ref, result.seq), json.dumps(record, indent=2).encode()
            )
        except ArchiveExistsError:
            log.info("compaction.record_exists", session_id=ref.session_id, seq=result.seq)

    async def _commit(self, ref: SessionRef, result: CompactionResult) -> None:
        now = self.clock()
        async with self.database.session() as db:
            await CompactionRepository(db).add(
                SessionCompaction(
                    session_id=ref.session_id,
                    seq=result.seq,
                    first_message_seq=result.first_message_seq,
                    last_message_seq=result.last_message_seq,
                    messages_compacted=result.messages_compacted,
                    tokens_before=result.tokens_before,
                    tokens_after=result.tokens_after,
                    archive_ref=result.archive_ref,
                    summary=result.summary,
                    facts=[asdict(fact) for fact in result.facts],
                    created_at=now,
                )
            )
            await remember_facts(
                db, ref.user_id, result.facts, source_session_id=ref.session_id, at=now
            )
            session = await SessionRepository(db).get(ref.session_id, for_update=True)
            if session is not None:
                session.compaction_count = result.seq
                session.context_tokens = result.tokens_after
                _back(session, now)

    async def _back_to_active(self, session_id: str) -> None:
        async with self.database.session() as db:
            session = await SessionRepository(db).get(session_id, for_update=True)
            if session is not None:
                _back(session, self.clock())


def _back(session: Session, now: datetime) -> None:
    if session.status == SessionStatus.COMPACTING.value:
        transition(session, SessionStatus.ACTIVE, at=now, reason="compaction over")
