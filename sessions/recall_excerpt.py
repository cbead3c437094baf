"""The part of a recalled passage that a turn shows: the stretch of at most `limit` characters
that holds most of what the question asks about (`excerpt`).

A passage found by recall can be longer than what the context gives each one (an answer of
several paragraphs), and what made it match can be anywhere in it: a client's name in its last
sentence. Cutting it from the start would show the model the passage without the part that
answers. So the excerpt is the window with the most weight of the question's words
(`question_words`): each word counts once, a name or a number (`sessions.recall_query.
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
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sessions.recall_query import names_and_numbers, query_terms

NAME_WEIGHT = 3.0
"""What a name or a number of the question weighs against a plain word."""

ELLIPSIS = "…"
_MIN_PREFIX = 4
# Where a word may begin: not right after a letter or digit.
_WORD_START = r"(?<![^\W_])"
_WORD_END = r"(?![^\W_])"


@dataclass(frozen=True, slots=True)
class QuestionWords:
    """A question's searched words (lower case, no stopwords) with their weights, and one
    pattern finding, in a passage, the words that stand for them (`question_words`)."""

    weights: Mapping[str, float]
    pattern: re.Pattern[str] | None
    # Each prefix a longer word must begin with, by its length: the question's word.
    prefixes: Mapping[int, Mapping[str, str]]

    def found(self, text: str) -> list[tuple[int, int, str]]:
        """Where the text's words stand for the question's: start, end, the question's word."""
        if self.pattern is None:
            return []
        found: list[tuple[int, int, str]] = []
        for match in self.pattern.finditer(text):
            word = match.group().lower()
            wanted = word if word in self.weights else None
            for length, prefixes in self.prefixes.items():
                if wanted is None:
                    wanted = prefixes.get(word[:length])
            if wanted is not None:  # a case-folded match that is no longer one: left out
                found.append((match.start(), match.end(), wanted))
        return found


def question_words(question: str) -> QuestionWords:
    """The question's searched words, each with its weight, and their pattern."""
    named = names_and_numbers(question)
    weights = {word: NAME_WEIGHT if word in named else 1.0 for word in query_terms(question)}
    prefixes: dict[int, dict[str, str]] = {}
    alternatives: list[str] = []
    for word in sorted(weights, key=len, reverse=True):
        if len(word) < _MIN_PREFIX:
            alternatives.append(re.escape(word) + _WORD_END)
        else:
            prefix = word[: max(_MIN_PREFIX, len(word) - 2)]
            prefixes.setdefault(len(prefix), {}).setdefault(prefix, word)
            alternatives.append(re.escape(prefix) + r"[^\W_]*")
    pattern = (
        re.compile(_WORD_START + "(?:" + "|".join(alternatives) + ")", re.IGNORECASE)
        if alternatives
        else None
    )
    return QuestionWords(weights, pattern, prefixes)


def excerpt(text: str, words: QuestionWords, limit: int) -> str:
    """`text` with its runs of white space made single spaces; if longer than `limit`
    characters, the part of at most `limit` (the "…" included) with the most weight of the
    question's words, widened to word boundaries."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    room = limit - 2 * len(ELLIPSIS)
    if room < 1:
        return text[: max(limit - len(ELLIPSIS), 0)] + ELLIPSIS
    found = words.found(text)
    window = heaviest_window(found, words.weights, room)
    if window is None:
        return _cut(text, 0, limit - len(ELLIPSIS))
    start, end = found[window[0]][0], found[window[1]][1]
    spare = room - (end - start)
    start = max(start - spare // 2, 0)
    end = min(start + room, len(text))
    start = max(end - room, 0)
    return _cut(text, start, end)


def heaviest_window(
    found: Sequence[tuple[int, int, str]], weights: Mapping[str, float], room: int
) -> tuple[int, int] | None:
    """The first and last index into `found` (start, end, word; in order) of the window of
    at most `room` characters holding the most weight (each word once), then the heaviest
    word, then the earliest; None when no word fits."""
    best: tuple[float, float] = (0.0, 0.0)
    chosen: tuple[int, int] | None = None
    held: Counter[str] = Counter()
    weight = 0.0
    last = -1
    for first in range(len(found)):
        while last + 1 < len(found) and found[last + 1][1] - found[first][0] <= room:
            last += 1
            word = found[last][2]
            held[word] += 1
            weight += weights[word] if held[word] == 1 else 0.0
        if last < first:
            last = first  # one word longer than the room: not a window
            continue
        if weight >= best[0]:
            heaviest = max(weights[word] for word in held)
            if (weight, heaviest) > best:
                best, chosen = (weight, heaviest), (first, last)
        word = found[first][2]
        held[word] -= 1
        if held[word] == 0:
            del held[word]
            weight -= weights[word]
    return chosen


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
