"""The `search_past_conversations` tool the model can call: its spec (`SEARCH_TOOL`), the
reading of its input (a query, optional dates, a limit) and the text it returns
(`run_search_tool`, one `hit_line` per passage).

The tool searches thoroughly (`sessions.recall.THOROUGH`): the model asked for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sessions.llm import ToolSpec
from sessions.recall import RecallSearch
from sessions.recall_excerpt import QuestionWords, excerpt, question_words
from sessions.recall_values import RecallExclusions, RecallHit

SEARCH_TOOL_NAME = "search_past_conversations"
SEARCH_TOOL_MAX_HITS = 20
SEARCH_TOOL = ToolSpec(
    name=SEARCH_TOOL_NAME,
    description=(
        "Search the user's earlier conversations with you (all past sessions, and the parts of "
        "this one that were summarised) for what was said. Use it when the user refers to "
        "something discussed before that is not in the conversation you can see. Returns "
        "matching messages with their dates and speakers, best first."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "What to look for: the key words (names, topics, decisions).",
            },
            "since": {
                "type": "string",
                "description": "Only what was said on or after this date (YYYY-MM-DD).",
            },
            "until": {
                "type": "string",
                "description": "Only what was said on or before this date (YYYY-MM-DD).",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": SEARCH_TOOL_MAX_HITS,
                "description": "How many results at most (default 8).",
            },
        },
        "required": ["query"],
    },
)


def hit_line(hit: RecallHit, words: QuestionWords, *, max_chars: int = 400) -> str:
    """A hit as one line for the model: date, speaker (or "summary"), session, and its text,
    or the part of it about the query's `words` when longer than `max_chars`."""
    text = excerpt(hit.text, words, max_chars)
    who = hit.speaker if hit.kind == "turn" else "summary"
    return f"- {hit.date:%Y-%m-%d} {who} (session {hit.session_id[:8]}): {text}"


def _tool_date(value: Any, name: str) -> date | None:
    if value is None or value == "":
        return None
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        raise ValueError(f"{name} must be a date as YYYY-MM-DD, not {value!r}") from None


async def run_search_tool(
    recall: RecallSearch,
    tool_input: Mapping[str, Any],
    user_id: str,
    *,
    exclude: RecallExclusions | None = None,
) -> str:
    """Run `search_past_conversations` for the user; the text the model gets back.

    Raises `ValueError` for input the model got wrong (the engine reports it as a tool error).
    """
    query = tool_input.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query must be a non-empty string")
    since = _tool_date(tool_input.get("since"), "since")
    until = _tool_date(tool_input.get("until"), "until")
    raw_limit = tool_input.get("limit", 8)
    limit = raw_limit if isinstance(raw_limit, int) else 8
    hits = await recall.search(
        user_id,
        query,
        min(max(limit, 1), SEARCH_TOOL_MAX_HITS),
        since=datetime.combine(since, time(), UTC) if since else None,
        until=datetime.combine(until, time(), UTC) + timedelta(days=1) if until else None,
        exclude=exclude,
        thorough=True,
    )
    if not hits:
        return f"Nothing in earlier conversations matched {query!r}."
    words = question_words(query)
    lines = [hit_line(hit, words, max_chars=600) for hit in hits]
    return f"{len(hits)} passage(s) from earlier conversations, best first:\n" + "\n".join(lines)
