"""The part of a recalled passage that a turn shows: the stretch of at most `limit` characters
that holds most of what the question asks about (`excerpt`).

A passage found by recall can be longer than what the context gives each one (an answer of
several paragraphs), and what made it match can be anywhere in it: a client's name in its last
sentence. Cutting it from the start would show the model the passage without the part that
answers. So the excerpt is the window with the most weight of the question's words
(`question_weights`): each word counts once, a name or a number (`sessions.recall_query.
names_and_numbers`) three times a plain word; between windows of equal weight, the one
holding the heavier word, then the earlier. A word of the passage stands for a word of the
question when one is the other, or both begin with the same first letters (at least four;
all but two of the question word's, for a longer one), so "renewals" stands for "renewal" and
"planning" for "plans". The window then widens evenly around what it holds, to word
boundaries, with "…" where the passage goes on. A passage that holds none of the words (found
by its meaning, under dense recall) is cut from its start.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sessions.recall_query import names_and_numbers, query_terms

NAME_WEIGHT = 3.0
"""What a name or a number of the question weighs against a plain word."""

ELLIPSIS = "…"
_WORD = re.compile(r"[^\W_]+")
_MIN_PREFIX = 4


def question_weights(question: str) -> dict[str, float]:
    """The question's searched words (lower case, no stopwords), each with its weight."""
    named = names_and_numbers(question)
    return {word: NAME_WEIGHT if word in named else 1.0 for word in query_terms(question)}


def _prefix(word: str) -> str:
    """What a passage's word must begin with to stand for `word` (all of it when short)."""
    if len(word) < _MIN_PREFIX:
        return word
    return word[: max(_MIN_PREFIX, len(word) - 2)]


def excerpt(text: str, weights: Mapping[str, float], limit: int) -> str:
    """`text` with its runs of white space made single spaces; if longer than `limit`
    characters, the part of at most `limit` (the "…" included) with the most weight of
    `weights`' words, widened to word boundaries."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    room = limit - 2 * len(ELLIPSIS)
    if room < 1:
        return text[: max(limit - len(ELLIPSIS), 0)] + ELLIPSIS
    prefixes = {word: _prefix(word) for word in weights}
    found: list[tuple[int, int, str]] = []  # start, end, the question's word it stands for
    for match in _WORD.finditer(text):
        word = match.group().lower()
        for wanted, prefix in prefixes.items():
            if word == wanted or (
                len(word) >= len(prefix) >= _MIN_PREFIX and word.startswith(prefix)
            ):
                found.append((match.start(), match.end(), wanted))
                break
    if not found:
        return _cut(text, 0, limit - len(ELLIPSIS))
    # The window's weight, then its heaviest word's (a name rather than plain words), then
    # the earliest; and its first and last index into `found`.
    best: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)
    last = 0
    for first in range(len(found)):
        last = max(last, first)
        while last + 1 < len(found) and found[last + 1][1] - found[first][0] <= room:
            last += 1
        if found[last][1] - found[first][0] > room:
            continue  # one word longer than the room: not a window
        held = [weights[word] for word in {f[2] for f in found[first : last + 1]}]
        if (sum(held), max(held)) > best[:2]:
            best = (sum(held), max(held), first, last)
    if best[0] == 0.0:
        return _cut(text, 0, limit - len(ELLIPSIS))
    start, end = found[best[2]][0], found[best[3]][1]
    spare = room - (end - start)
    start = max(start - spare // 2, 0)
    end = min(start + room, len(text))
    start = max(end - room, 0)
    return _cut(text, start, end)


def _cut(text: str, start: int, end: int) -> str:
    """`text[start:end]` moved in to word boundaries, with "…" at each end the text goes on."""
    if start > 0 and text[start - 1].isalnum():
        space = text.find(" ", start, end)
        start = space + 1 if space != -1 else start
    if end < len(text) and text[end].isalnum():
        space = text.rfind(" ", start, end)
        end = space if space > start else end
    part = text[start:end].strip()
    return (ELLIPSIS if start > 0 else "") + part + (ELLIPSIS if end < len(text) else "")
