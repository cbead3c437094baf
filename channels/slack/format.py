"""Slack's text formats: mrkdwn to plain text (inbound), Markdown to mrkdwn and long answers
split at Slack's message limit (outbound). Pure functions, no I/O."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

_ENTITY = re.compile(r"<([^<>]+)>")


def slack_text(text: str, names: Mapping[str, str] | None = None) -> str:
    """Slack mrkdwn as plain text: mentions, channels, links and special mentions spelled out,
    HTML escapes undone. `names` maps user ids to display names."""
    names = names or {}

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1)
        target, _, label = inner.partition("|")
        if target.startswith("@"):
            return "@" + (label or names.get(target[1:], target[1:]))
        if target.startswith("#"):
            return "#" + (label or target[1:])
        if target.startswith("!subteam^"):
            return label or "@team"
        if target.startswith("!"):
            return "@" + (label or target[1:].split("^")[0])
        if target.startswith("mailto:"):
            return label or target.removeprefix("mailto:")
        if label and label != target:
            return f"{label} ({target})"
        return target

    return html.unescape(_ENTITY.sub(replace, text))


SLACK_TEXT_LIMIT = 3900  # Slack truncates message text past 4,000 characters
_CODE = re.compile(r"(```.*?```|`[^`\n]+`)", re.S)
# In this order: italics before bold, whose output (*x*) would otherwise read as italics.
_INLINE_RULES: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"\[([^\]]+)\]\((https?://[^)\s]+)\)"), r"<\2|\1>"),
    (re.compile(r"(?<![*\w])\*(?!\s)([^*\n]+?)\*(?![*\w])"), r"_\1_"),
    (re.compile(r"\*\*(.+?)\*\*|__(.+?)__"), lambda m: f"*{m.group(1) or m.group(2)}*"),
    (re.compile(r"~~(.+?)~~"), r"~\1~"),
    (re.compile(r"^#{1,6}\s+(.+)$", re.M), r"*\1*"),
)


def markdown_to_mrkdwn(markdown: str) -> str:
    """The model's Markdown as Slack mrkdwn: bold, italics, strike-through, links, headings;
    `&`, `<`, `>` escaped; code spans and blocks left as they are."""
    parts = _CODE.split(markdown)
    converted = []
    for index, part in enumerate(parts):
        if index % 2:  # a code span or block
            converted.append(part)
            continue
        # Escape first: the link rule below writes Slack's own <url|label> brackets.
        text = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        for pattern, replacement in _INLINE_RULES:
            text = pattern.sub(replacement, text)
        converted.append(text)
    return "".join(converted)


def split_for_slack(text: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """`text` in pieces of at most `limit` characters, cut at paragraph breaks, else at line
    breaks, else at spaces; never an empty piece."""
    pieces: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        window = rest[:limit]
        cut = max(window.rfind("\n\n"), 0) or max(window.rfind("\n"), 0) or window.rfind(" ")
        if cut <= 0:
            cut = limit
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        pieces.append(rest)
    return pieces
