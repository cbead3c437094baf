"""Strips what a reply quotes, so the assistant sees only what the person wrote.

Two passes, both on plain text:

1. `remove_own_texts`: when a reply names a message we sent (In-Reply-To / References), the
   text of our message is removed wherever it appears, quoted (``> …``) or not, compared word by
   word so that re-wrapping, quote marks and Markdown rendering do not matter.
2. `strip_quotes`: the general pass. Quoted lines (``>``) are dropped wherever they are, so
   answers written between quoted paragraphs survive. A quote header
   (`channels.email.quote_headers`: an attribution such as ``On … wrote:``, a separator such as
   ``-----Original Message-----``, Outlook's ``From: / Sent:`` block) is dropped when quoted
   lines follow it, and cuts the rest of the text when unquoted text follows it (top-posting:
   what is below is the quoted message, whatever its language). Finally the signature after an
   RFC 3676 ``-- `` line, trailing client lines ("Sent from my …") and invisible characters go
   (`channels.email.signature`).

Callers bound the text's size and line lengths first (the regular expressions backtrack).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from channels.email.quote_headers import find_quote_headers
from channels.email.signature import remove_invisible, without_signature

_QUOTED = re.compile(r"^\s*>")
_WORD = re.compile(r"\w+")
# An own text shorter than this is too likely to occur in what the person wrote.
_MIN_OWN_WORDS = 4


def strip_reply(text: str, *, own_texts: Sequence[str] = ()) -> str:
    """What the person wrote in `text`, without our quoted messages, other quotes and
    signatures. Never empty when `text` is not: all-quote mail keeps its text."""
    text = remove_invisible(text.replace("\r\n", "\n").replace("\r", "\n"))
    unquoted = remove_own_texts(text, own_texts) if own_texts else text
    stripped = strip_quotes(unquoted)
    if stripped or not unquoted.strip():
        return stripped
    return _tidy(unquoted.split("\n"))


def remove_own_texts(text: str, own_texts: Sequence[str]) -> str:
    """`text` without the lines that hold one of `own_texts`, quoted or not."""
    lines = text.split("\n")
    removed = [False] * len(lines)
    tokens: list[tuple[str, int]] = []
    for index, line in enumerate(lines):
        unquoted = re.sub(r"^[\s>]+", "", line)
        tokens.extend((word, index) for word in _WORD.findall(unquoted.lower()))
    words = [word for word, _ in tokens]
    for own in own_texts:
        needle = _WORD.findall(own.lower())
        if len(needle) < _MIN_OWN_WORDS:
            continue
        for start in _occurrences(words, needle):
            first, last = tokens[start][1], tokens[start + len(needle) - 1][1]
            for index in range(first, last + 1):
                removed[index] = True
    return "\n".join(line for line, gone in zip(lines, removed, strict=True) if not gone)


def _occurrences(words: list[str], needle: list[str]) -> list[int]:
    """Start indexes of `needle` as a contiguous run in `words` (no overlaps)."""
    found: list[int] = []
    start, size = 0, len(needle)
    first = needle[0]
    while True:
        try:
            start = words.index(first, start)
        except ValueError:
            return found
        if words[start : start + size] == needle:
            found.append(start)
            start += size
        else:
            start += 1


def strip_quotes(text: str) -> str:
    """`text` without quoted lines, quote headers, what follows an unquoted quote header, and
    the signature."""
    lines = text.split("\n")
    headers = find_quote_headers(lines)
    kept: list[str] = []
    dropped = False  # whether the last non-blank line seen was a dropped quote
    index = 0
    while index < len(lines):
        header = headers.get(index)
        if header is not None:
            end, certain = header.last, header.certain
            after = _next_non_blank(lines, end + 1)
            if after is None or _QUOTED.match(lines[after]):
                index, dropped = end + 1, True  # a header over quoted lines: drop it, go on
                continue
            if certain and any(line.strip() for line in kept):
                break  # a header over unquoted text: everything below is the quoted message
            if certain:
                index = end + 1  # a header block on top heads the text itself (pasted mail)
                continue
        line = lines[index]
        if _QUOTED.match(line):
            dropped = True
        elif line.strip() or not dropped or (kept and kept[-1].strip()):
            # Blank lines around a dropped quote collapse into one.
            kept.append(line)
            dropped = dropped and not line.strip()
        index += 1
    return _tidy(without_signature(kept))


def _next_non_blank(lines: Sequence[str], start: int) -> int | None:
    for index in range(start, len(lines)):
        if lines[index].strip():
            return index
    return None


def _tidy(lines: Sequence[str]) -> str:
    """Trailing spaces off each line, leading and trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in lines).strip("\n")
