"""The rows of `context.py`'s data, without I/O: realistic texts, a session's messages,
compactions, channels and counters as a running gateway leaves them (compactions placed by
the engine's own policy), and a user's long history of archived sessions."""

from __future__ import annotations

import math
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from sessions.compaction import CompactionPolicy, split_point
from sessions.context import SUMMARY_LEAD_IN, HistoryMessage
from sessions.llm import estimate_tokens
from storage.models import SessionStatus
from storage.transcripts import SessionRef, pre_compact_archive_key, transcript_segments_prefix

ORG_ID = "acme"
HISTORY_SESSION_TURNS = 300
RARE_EVERY = 5_000  # history turns; one of them mentions the client
RARE_NAME = "Halvorsen"  # the client
RARE_MENTION = f"The {RARE_NAME} renewal still waits for their procurement sign-off."
RARE_QUESTION = f"Where did we leave the {RARE_NAME} renewal?"
CHANNEL = "slack"
CHANNEL_ID = "D0BENCH"
MESSAGE_INTERVAL = timedelta(seconds=30)
THREAD_EVERY = 60  # messages; the last THREAD_LENGTH of each block are in a thread
THREAD_LENGTH = 10


# --- realistic text -----------------------------------------------------------------------

SUBJECTS = (
    "the quarterly report",
    "the onboarding checklist",
    "our vendor contract",
    "the migration plan",
    "the customer escalation",
    "next week's offsite",
    "the hiring pipeline",
    "the security review",
    "the pricing page",
    "the release notes",
)
PEOPLE = ("Priya", "Marco", "the finance team", "legal", "Jonas", "the support lead", "Aiko")
TEMPLATES = (
    "Could you draft a short note to {person} about {subject} before {day}?",
    "I went through {subject} again and the numbers in section {n} still look off to me.",
    "Here is what I found: {subject} depends on two approvals, and {person} owns one of them.",
    "Let's keep the tone friendly but firm, since {person} asked for a decision by {day}.",
    "The main risk with {subject} is the timeline; we lose about {n} days if nothing changes.",
    "I would summarise it in three points and put the open questions for {person} at the end.",
    "Please remind me on {day} to follow up with {person} on {subject}.",
    "That works for me, but can we double-check the figures for {subject} with {person}?",
    "Good point. I updated the draft and moved the part about {subject} to the top.",
    "Based on the last {n} messages, the agreed next step is to send {subject} to {person}.",
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "the end of the month")


class TextSource:
    """Deterministic, realistic-looking message, summary and fact texts."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    def sentence(self) -> str:
        """One sentence of a work conversation."""
        pick = self.random.choice
        return pick(TEMPLATES).format(
            person=pick(PEOPLE), subject=pick(SUBJECTS), day=pick(DAYS), n=self.random.randint(2, 9)
        )

    def text(self, min_chars: int, max_chars: int, *, bullet: str = "") -> str:
        """Sentences (one per line when `bullet` starts them) filling 'min_chars..max_chars'."""
        target = self.random.randint(min_chars, max_chars)
        separator = "\n" if bullet else " "
        parts: list[str] = []
        length = 0
        while length < target:
            part = bullet + self.sentence()
            parts.append(part)
            length += len(part) + 1
        joined = separator.join(parts)
        return joined[:target].rsplit(" ", 1)[0].rstrip(",;.?") + "."

    def message(self) -> str:
        """A chat message."""
        return self.text(200, 600)

    def summary(self, number: int) -> str:
        """The summary of the n-th compaction: it folds the previous ones in, so it grows."""
        top = min(1_500 + 500 * number, 6_000)
        return self.text(max(top - 500, 1_500), top, bullet="- ")

    def facts(self) -> list[dict[str, str]]:
        """The facts a compaction extracted (often none)."""
        return [
            {"category": self.random.choice(("preference", "commitment", "fact")), "fact": f}
            for f in (self.sentence() for _ in range(self.random.choice((0, 0, 1, 2, 3))))
        ]


# --- sessions shaped like a running gateway's -----------------------------------------------


class TranscriptPlanner:
    """The rows of one session: its messages (streamed), compactions, channels and counters.

    Compactions are placed by the engine's own rules: at every user message (a turn) the
    policy decides whether the history since the last compaction needs one, and
    `split_point` decides how much of it goes, exactly as `Compactor` would.
    """

    def __init__(
        self,
        ref: SessionRef,
        size: int,
        *,
        ordinal: int,
        policy: CompactionPolicy,
        texts: TextSource,
        start: datetime,
        last_question: str = "",
    ) -> None:
        self.ref = ref
        self.last_question = last_question
        self.size = size
        self.ordinal = ordinal
        self.policy = policy
        self.texts = texts
        self.start = start
        self.compactions: list[dict[str, Any]] = []
        self.channel_messages: Counter[str] = Counter()  # thread id ('' for none) → messages
        self.roles: Counter[str] = Counter()
        self.input_tokens = 0
        self.output_tokens = 0
        self.last_at = start
        self.since: list[HistoryMessage] = []  # the messages after the last compaction
        self.summary: str | None = None

    def thread_of(self, index: int) -> str:
        """The thread of the index-th message ('' outside threads), unique to this session."""
        block, position = divmod(index, THREAD_EVERY)
        if position < THREAD_EVERY - THREAD_LENGTH:
            return ""
        opened = self.start + MESSAGE_INTERVAL * (block * THREAD_EVERY)
        return f"{int(opened.timestamp())}.{self.ordinal:03d}{block:03d}"

    def messages(self) -> Iterator[dict[str, Any]]:
        """The session's message rows, in sequence order (compactions are noted on the way)."""
        asked = ""
        for index in range(self.size):
            seq = index + 1
            role = "user" if index % 2 == 0 else "assistant"
            thread_id = self.thread_of(index)
            content = self.texts.message()
            if role == "user" and index >= self.size - 2 and self.last_question:
                content = f"{content} {self.last_question}"
            tokens = len(content) // 4
            at = self.start + MESSAGE_INTERVAL * index
            if role == "user":
                message_id = f"{int(at.timestamp())}.{seq:06d}"
                in_reply_to = None
                metadata: dict[str, Any] = {"channel_id": CHANNEL_ID}
                asked = message_id
            else:
                message_id = f"out-{uuid.uuid4().hex}"
                in_reply_to = asked
                metadata = {}
                self.output_tokens += tokens
            self.since.append(HistoryMessage(seq, role, content, tokens, thread_id))
            if role == "user":
                self.turn(at)
            self.roles[role] += 1
            self.channel_messages[thread_id] += 1
            self.last_at = at
            yield {
                "session_id": self.ref.session_id,
                "seq": seq,
                "role": role,
                "channel_type": CHANNEL,
                "thread_id": thread_id,
                "message_id": message_id,
                "in_reply_to": in_reply_to,
                "content": content,
                "tokens": tokens,
                "created_at": at,
                "metadata": metadata,
            }

    @property
    def summary_tokens(self) -> int:
        """What the latest summary costs in the context (as `sessions.context.assemble` counts)."""
        if self.summary is None:
            return 0
        block = f"<summary>\n{self.summary}\n</summary>"
        return estimate_tokens(block) + estimate_tokens(SUMMARY_LEAD_IN)

    def turn(self, at: datetime) -> None:
        """A turn starts: bill its context, and compact first when the policy says so."""
        history_tokens = self.summary_tokens + sum(m.cost for m in self.since)
        self.input_tokens += history_tokens
        if not self.policy.needed(history_tokens, len(self.since)):
            return
        cut = split_point(self.since, self.policy.keep_last_messages, self.policy.max_kept_tokens)
        if cut == 0:
            return
        compacted, kept = self.since[:cut], self.since[cut:]
        number = len(self.compactions) + 1
        summary = self.texts.summary(number)
        previous = estimate_tokens(self.summary) if self.summary else 0
        self.compactions.append(
            {
                "session_id": self.ref.session_id,
                "seq": number,
                "first_message_seq": compacted[0].seq,
                "last_message_seq": compacted[-1].seq,
                "messages_compacted": len(compacted),
                "tokens_before": sum(m.cost for m in self.since) + previous,
                "tokens_after": estimate_tokens(summary) + sum(m.cost for m in kept),
                "archive_ref": pre_compact_archive_key(self.ref, number),
                "summary": summary,
                "facts": self.texts.facts(),
                "created_at": at,
            }
        )
        self.since = kept
        self.summary = summary

    def channel_rows(self) -> list[dict[str, Any]]:
        """The session's `session_channels` rows (call after `messages` is exhausted)."""
        return [
            {
                "session_id": self.ref.session_id,
                "channel_type": CHANNEL,
                "channel_id": CHANNEL_ID,
                "thread_id": thread_id,
                "joined_at": self.start,
                "last_message_at": self.last_at,
                "message_count": count,
            }
            for thread_id, count in self.channel_messages.items()
        ]

    def counters(self) -> dict[str, Any]:
        """The session row's counters once every message is in."""
        context_tokens = self.summary_tokens + sum(m.cost for m in self.since)
        return {
            "last_seq": self.size,
            "message_count": self.size,
            "user_message_count": self.roles["user"],
            "assistant_message_count": self.roles["assistant"],
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "context_tokens": context_tokens,
            "compaction_count": len(self.compactions),
            "last_active_at": self.last_at,
            "updated_at": self.last_at,
            "transcript_ref": transcript_segments_prefix(self.ref),
            "topic_summary": "Planning the vendor contract renewal and the quarterly report.",
            "topics": ["vendor contract", "quarterly report", "migration"],
        }

    def recent_thread(self) -> str:
        """A thread with messages since the last compaction (else the latest one at all)."""
        recent = [m.thread_id for m in self.since if m.thread_id]
        if recent:
            return recent[-1]
        threads = [thread for thread in self.channel_messages if thread]
        return threads[-1] if threads else ""


def history_rows(
    user_id: str, turns: int, texts: TextSource, *, ended: datetime
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]]:
    """Archived sessions of `HISTORY_SESSION_TURNS` turns, one a day up to `ended`: each
    session's row, its messages and its summary. One turn in `RARE_EVERY` mentions the client
    the current session asks about."""
    sessions = math.ceil(turns / HISTORY_SESSION_TURNS)
    for number in range(sessions):
        first = number * HISTORY_SESSION_TURNS
        size = min(HISTORY_SESSION_TURNS, turns - first)
        day = ended - timedelta(days=sessions - number)
        session_id = str(uuid.uuid4())
        session = {
            "id": session_id,
            "user_id": user_id,
            "org_id": ORG_ID,
            "status": SessionStatus.ARCHIVED.value,
            "created_at": day,
            "updated_at": day,
            "last_active_at": day + MESSAGE_INTERVAL * size,
            "current_since": day,
            "archived_at": day + timedelta(hours=4),
            "message_count": size,
            "user_message_count": (size + 1) // 2,
            "assistant_message_count": size // 2,
            "last_seq": size,
            "topic_summary": "Earlier work on the quarterly report and the vendor contract.",
        }
        messages = []
        for index in range(size):
            content = texts.message()
            if (first + index) % RARE_EVERY == RARE_EVERY // 2:
                content = f"{content} {RARE_MENTION}"
            messages.append(
                {
                    "session_id": session_id,
                    "seq": index + 1,
                    "role": "user" if index % 2 == 0 else "assistant",
                    "channel_type": CHANNEL,
                    "thread_id": "",
                    "content": content,
                    "tokens": len(content) // 4,
                    "created_at": day + MESSAGE_INTERVAL * index,
                    "metadata": {},
                }
            )
        summary = {
            "session_id": session_id,
            "user_id": user_id,
            "summary": texts.text(250, 600),
            "topics": ["quarterly report"],
            "message_count": size,
            "created_at": day + timedelta(hours=4),
        }
        yield session, messages, summary
