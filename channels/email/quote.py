"""Strips what a reply quotes, so the assistant sees only what the person wrote.

Two passes, both on plain text:

1. `remove_own_texts`: when a reply names a message we sent (In-Reply-To / References), the
   text of our message is removed wherever it appears, quoted (``> …``) or not, compared word by
   word so that re-wrapping, quote marks and Markdown rendering do not matter.
2. `strip_quotes`: the general pass. Quoted lines (``>``) are dropped wherever they are, so
   answers written between quoted paragraphs survive. A quote header (``On … wrote:``,
   Outlook's ``From: / Sent:`` block, ``-----Original Message-----``, a line of underscores)
   in 14 languages (the patterns of mail-parser-reply) is dropped when quoted lines follow it,
   and cuts the rest of the text when unquoted text follows it (top-posting). Finally the
   signature after an RFC 3676 ``-- `` line and a trailing "Sent from my …" line go.

Signatures are otherwise kept: a greeting such as "Thanks," is too often the start of what
someone wrote. Callers bound the text's size and line lengths first (the regular expressions
backtrack).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from mailparser_reply import EmailMessage  # type: ignore[import-untyped]
from mailparser_reply.constants import MAIL_LANGUAGES  # type: ignore[import-untyped]

from channels.email import forward_patterns as fp

_QUOTED = re.compile(r"^\s*>")
_WORD = re.compile(r"\w+")
_SEPARATOR_LINE = re.compile(r"^\s*(_{30,}|-{30,}|-{5,} ?Original Message ?-{5,})\s*$", re.I)
# "… wrote:" in the languages mail-parser-reply lacks (and others), up to two lines long.
_WROTE_VERBS = (
    r"\b(?:wrote|написал[аи]?|пишет|написав|napisał[a]?|a écrit|escribió|escreveu|ha scritto|"
    r"schreef|schrieb|skrev|kirjoitti|yazdı|írta|"  # noqa: RUF001 (Turkish dotless i)
    r"napsal(?:\(a\))?|napísal|scrie|έγραψε)\s?:[ \t]*$"
)
_WROTE = re.compile(r"^(?!>)[^\n]{0,300}" + _WROTE_VERBS, re.M | re.I)
# Wrapped over two lines: the first names a date or an address ("… 14:20 Bob <\nbob@x> wrote:").
_WROTE_WRAPPED = re.compile(
    r"^(?!>)(?=[^\n]*[\d@])[^\n]{0,300}\n(?!>)[^\n]{0,300}" + _WROTE_VERBS, re.M | re.I
)
# A line ending in ':' that names an address or a date, as attribution lines do.
_SOFT_ATTRIBUTION = re.compile(
    r"^(?!>)(?=[^\n]*(?:@|\d{1,2}:\d{2}|\d{1,4}[./-]\d{1,2}[./-]\d{1,4}))[^\n]{0,300}:[ \t]*$",
    re.M,
)
_SIGNATURE_DELIMITER = re.compile(r"^--\s?$")
_MAX_SIGNATURE_LINES = 15
_BLOCK_LABELS = (
    *fp.ORIGINAL_DATE,
    *fp.ORIGINAL_TO,
    *fp.ORIGINAL_CC,
    *fp.ORIGINAL_SUBJECT,
    *fp.ORIGINAL_REPLY_TO,
    # Yahoo's "Sent:"-style labels, anchored like the others.
    *(re.compile("^" + pattern.pattern, pattern.flags) for pattern in fp.ORIGINAL_DATE_LAX),
)
# An own text shorter than this is too likely to occur in what the person wrote.
_MIN_OWN_WORDS = 4


@lru_cache(maxsize=1)
def _header_pattern() -> re.Pattern[str]:
    """mail-parser-reply's quote-header pattern for all of its languages, built once."""
    languages = [language for language in MAIL_LANGUAGES if language != "david"]
    pattern: re.Pattern[str] = EmailMessage(text="", languages=languages).HEADER_REGEX
    return pattern


@lru_cache(maxsize=1)
def _sent_from_pattern() -> re.Pattern[str]:
    """A whole line that is a mobile client's signature ("Sent from my iPhone")."""
    phrases = [entry["sent_from"] for entry in MAIL_LANGUAGES.values() if entry.get("sent_from")]
    alternatives = "|".join(f"(?:{phrase})" for phrase in phrases)
    return re.compile(rf"^\s*(?:{alternatives}|Sent with \w+)[\w.<>:/()' -]{{0,60}}$", re.I)


def strip_reply(text: str, *, own_texts: Sequence[str] = ()) -> str:
    """What the person wrote in `text`, without our quoted messages, other quotes and
    signatures. Never empty when `text` is not: all-quote mail keeps its text."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
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
    headers = _header_spans(lines)
    kept: list[str] = []
    dropped = False  # whether the last non-blank line seen was a dropped quote
    index = 0
    while index < len(lines):
        span = headers.get(index)
        if span is not None:
            end, certain = span
            after = _next_non_blank(lines, end + 1)
            if after is None or _QUOTED.match(lines[after]):
                index = end + 1  # a header over quoted lines (or nothing): drop it, go on
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
    return _tidy(_without_signature(kept))


def _header_spans(lines: Sequence[str]) -> dict[int, tuple[int, bool]]:
    """First line → (last line, certain) of each quote header. Uncertain headers (a line that
    merely ends in ':' after an address or a date) count only over quoted lines or nothing."""
    # Match on stripped lines, as mail-parser-reply does: HTML conversion indents.
    stripped = "\n".join(line.strip() for line in lines)
    spans: dict[int, tuple[int, bool]] = {}
    patterns = (
        (_header_pattern(), True),
        (_WROTE, True),
        (_WROTE_WRAPPED, True),
        (_SOFT_ATTRIBUTION, False),
    )
    for pattern, certain in patterns:
        for match in pattern.finditer(stripped):
            start = match.start()
            while start < match.end() and stripped[start] == "\n":
                start += 1
            first = stripped.count("\n", 0, start)
            last = first + match.group(0).strip("\n").count("\n")
            spans.setdefault(first, (last, certain))
    for index, line in enumerate(lines):
        if _SEPARATOR_LINE.match(line):
            spans.setdefault(index, (index, True))
        elif index not in spans:
            end = _header_block_end(lines, index)
            if end is not None:
                spans[index] = (end, True)
    return spans


def _header_block_end(lines: Sequence[str], index: int) -> int | None:
    """The last line of a localized ``From: / Sent: / To: / Subject:`` block starting at
    `index` (the forward parser's labels, ~25 languages), or None when there is none."""
    line = re.sub(r"^[>\s*]+", "", lines[index])
    if not any(pattern.match(line) for pattern in fp.ORIGINAL_FROM):
        return None
    end = None
    for later in range(index + 1, min(index + 6, len(lines))):
        candidate = re.sub(r"^[>\s*]+", "", lines[later])
        if not any(pattern.match(candidate) for pattern in _BLOCK_LABELS):
            break
        end = later
    return end


def _next_non_blank(lines: Sequence[str], start: int) -> int | None:
    for index in range(start, len(lines)):
        if lines[index].strip():
            return index
    return None


def _without_signature(lines: list[str]) -> list[str]:
    for index, line in enumerate(lines):
        if _SIGNATURE_DELIMITER.match(line) and len(lines) - index <= _MAX_SIGNATURE_LINES:
            lines = lines[:index]
            break
    last = _last_non_blank(lines)
    if last is not None and _sent_from_pattern().match(lines[last]):
        lines = lines[:last]
    return lines


def _last_non_blank(lines: Sequence[str]) -> int | None:
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].strip():
            return index
    return None


def _tidy(lines: Sequence[str]) -> str:
    """Trailing spaces off each line, leading and trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in lines).strip("\n")
