"""Finds the lines that head a quoted message in a reply's plain text, in any client's words.

Three kinds, each recognised by its shape first and by the tables of
`channels.email.reply_patterns` (plus mail-parser-reply's headers in 14 languages and the
forward parser's header labels in ~25) second, so that clients and languages nobody listed
still mostly work:

* an attribution: one to three lines, the last ending in a colon, that name a date, a time or
  an address ("On … wrote:", "Le … a écrit :", "2016-03-03 17:21 GMT+01:00 Bob <bob@x>:",
  wrapped by the client inside the mailbox or before the verb). It is *certain* with a verb of
  writing or a known form; otherwise it counts only over quoted lines;
* a separator line: a long rule of underscores or dashes, or a title between dashes
  (``-----Ursprüngliche Nachricht-----``, ``*-------- Original Message --------*``) in the
  table or over a header block;
* a header block: a "From:" line in some language, then "Label: value" lines (Outlook's
  embedded From / Sent / To / Subject).

The caller decides what the header means from what follows it (quoted lines or not).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from mailparser_reply import EmailMessage  # type: ignore[import-untyped]
from mailparser_reply.constants import MAIL_LANGUAGES  # type: ignore[import-untyped]

from channels.email import forward_patterns as fp
from channels.email import reply_patterns as rp

_QUOTED = re.compile(r"^\s*>")
_RULE_LINE = re.compile(r"^[\s>*]*(?:_{30,}|-{30,})[\s*_]*$")
# A title between dashes, decorated or not: "-----Original Message-----".
_DASHED_TITLE = re.compile(r"^[\s>*_]*-{2,}\s*([^\W_](?:[^-\n]|-(?!-)){1,150}?)\s*-{2,}[\s*_]*$")
# "Label: value", the label one to four words without digits (any language), as header blocks
# write them; the value may be empty ("Cc:").
_LABEL_LINE = re.compile(r"^[^\W\d_][^\W\d_.'’-]*(?:[ .'’-][^\W\d_]+){0,3}\s?[:：]")  # noqa: RUF001
_SPACES = re.compile(r"[\u00a0\u2007\u202f]")  # no-break spaces (French typography, iOS)
_MAILBOX = re.compile(r"<[^<>\s]+@[^<>\s]+>|\[mailto:")
_OPEN_MAILBOX = re.compile(r"[<\[][^<>\[\]]*$")
_HEADER_MARK = re.compile(r":(?!//)|：|original message", re.I)  # noqa: RUF001
_COLON_REACH = 2
_LINE_DECORATION = re.compile(r"^[>\s*]+")
_MAX_ATTRIBUTION_LINES = 3
_MAX_ATTRIBUTION_CHARS = 400
# A verb this close to the colon ends the attribution ("… schrieb Hans Müller:"); further away
# it needs an address in the line to count ("Hans <h@x> schrieb am Mo., 3. März 2025, 14:20:").
_MAX_VERB_TAIL = 50
# The verb last ("… Bob Smith wrote:").
_VERB_LAST = re.compile(r"\s*[:：]$")  # noqa: RUF001
# How the lines of a wrapped attribution join: one breaks off at a mailbox or a comma, the
# next starts with an address; no line but the last ends a sentence.
_BROKEN_OFF = re.compile(r"[<(\[\"]\s*$|[\d@>)][^,]*,\s*$")
_ADDRESS_START = re.compile(r"^\s*[^\s@<>]+@")
# A time (not a zone offset: "GMT+01:00"), a year, a numeric date.
_DATE_OR_TIME = re.compile(
    r"(?<![+\-\d])\d{1,2}[:.h]\d{2}|\b(?:19|20)\d{2}\b|\d{1,4}[./-]\d{1,2}[./-]\d{1,4}"
)
_MAX_WRAPPED_LINE = 200
_SENTENCE_END = re.compile(r"[.!?;:。！？]\s*$")  # noqa: RUF001
_MAX_BLOCK_LINES = 7


@dataclass(frozen=True, slots=True)
class QuoteHeader:
    """Lines `first`..`last` head a quoted message; `certain` when its words say so (an
    uncertain one merely looks like an attribution)."""

    first: int
    last: int
    certain: bool


def find_quote_headers(lines: Sequence[str]) -> dict[int, QuoteHeader]:
    """The quote headers in `lines`, by first line; where two start on one line, a certain one
    wins, else the first kind found (mail-parser-reply's, attributions, separators, blocks)."""
    found: dict[int, QuoteHeader] = {}
    for header in (
        *_mail_parser_reply_headers(lines),
        *_attributions(lines),
        *_separators_and_blocks(lines),
    ):
        known = found.get(header.first)
        if known is None or (header.certain and not known.certain):
            found[header.first] = header
    return found


@lru_cache(maxsize=1)
def _header_pattern() -> re.Pattern[str]:
    """mail-parser-reply's quote-header pattern for all of its languages, built once."""
    languages = [language for language in MAIL_LANGUAGES if language != "david"]
    pattern: re.Pattern[str] = EmailMessage(text="", languages=languages).HEADER_REGEX
    return pattern


def _mail_parser_reply_headers(lines: Sequence[str]) -> list[QuoteHeader]:
    # Match on stripped lines, as mail-parser-reply does: HTML conversion indents. Its headers
    # all have a colon or "Original Message" and reach at most two lines away from one; the
    # lines further away are blanked (their count kept), which spares the pattern most text.
    stripped = "\n".join(_near_a_colon(lines))
    headers = []
    for match in _header_pattern().finditer(stripped):
        start = match.start()
        while start < match.end() and stripped[start] == "\n":
            start += 1
        first = stripped.count("\n", 0, start)
        headers.append(QuoteHeader(first, first + match.group(0).strip("\n").count("\n"), True))
    return headers


def _near_a_colon(lines: Sequence[str]) -> list[str]:
    """`lines` stripped, blank unless within two lines of one with a colon (not a link's)."""
    near = [False] * len(lines)
    for index, line in enumerate(lines):
        if _HEADER_MARK.search(line):
            for other in range(
                max(0, index - _COLON_REACH), min(len(lines), index + _COLON_REACH + 1)
            ):
                near[other] = True
    return [line.strip() if keep else "" for line, keep in zip(lines, near, strict=True)]


def _attributions(lines: Sequence[str]) -> list[QuoteHeader]:
    headers = []
    for last, line in enumerate(lines):
        text = line.strip()
        if _QUOTED.match(line) or not (text.endswith((":", "：")) or text.endswith(">")):  # noqa: RUF001
            continue
        first = _attribution_start(lines, last)
        joined = _SPACES.sub(" ", " ".join(part.strip() for part in lines[first : last + 1]))
        certain = _attribution_kind(joined)
        if certain is not None:
            headers.append(QuoteHeader(first, last, certain))
    return headers


def _attribution_start(lines: Sequence[str], last: int) -> int:
    """Where the attribution ending at `last` starts: clients wrap long ones over two or three
    lines, inside the mailbox ("Bob <" / "bob@x> wrote:") or anywhere else."""
    first = last
    while first > last - _MAX_ATTRIBUTION_LINES + 1 and first > 0:
        if not _continues(lines[first - 1], lines[first : last + 1]):
            break
        first -= 1
    return first


def _continues(above: str, span: Sequence[str]) -> bool:
    """Whether `above` starts the attribution whose lines so far are `span`: `above` breaks
    off inside a mailbox or holds the verb, the mailbox moved down under a name ("Hans Müller"
    / "<hans@x> schrieb …"), or `above` names a date, time or address and the span goes on
    with a digit, a lower-case word, a script without case, or a name when the span itself
    names no date. A line of the person's own right above the attribution ("See you at 14:00"
    / "On Mon, Mar 3, 2025 at 2:20 PM Bob wrote:") stays out."""
    top = span[0]
    if not above.strip() or _QUOTED.match(above) or len(above) > _MAX_WRAPPED_LINE:
        return False
    named = _DATE_OR_TIME.search(above) is not None or "@" in above
    if _SENTENCE_END.search(above) and not named:
        return False
    if _BROKEN_OFF.search(above) or _verbs().search(above):
        return True
    first = top.lstrip()[:1]
    if first in "<([" or _ADDRESS_START.match(top):
        return True
    if not named:  # "wrote:", "a écrit :", or the year after "… Sen, 3 Mar"
        if first.isdigit():
            return any(char.isdigit() for char in above)
        return first.islower() and _DATE_OR_TIME.search(top) is None
    if first.isupper():
        return "@" in above or not any(_DATE_OR_TIME.search(line) for line in span)
    return True


def _attribution_kind(text: str) -> bool | None:
    """True for a certain attribution, False for one that only looks like it, else None."""
    if len(text) > _MAX_ATTRIBUTION_CHARS:
        return None
    if not text.endswith((":", "：")):  # noqa: RUF001 (only a known form ends otherwise)
        return True if any(form.search(text) for form in rp.ATTRIBUTION_FORMS) else None
    evidence = rp.ATTRIBUTION_EVIDENCE.search(text) is not None
    verb_last = False
    for found in _verbs().finditer(text):
        last = _VERB_LAST.match(text, found.end()) is not None
        if evidence and (last or len(text) - found.end() <= _MAX_VERB_TAIL or "@" in text):
            return True
        verb_last = verb_last or last
    if any(form.search(text) for form in rp.ATTRIBUTION_FORMS):
        return True
    # "Bob Smith wrote:" over quoted lines; over the person's text it may be a sentence.
    return False if evidence or verb_last else None


@lru_cache(maxsize=1)
def _verbs() -> re.Pattern[str]:
    """The verbs of attribution lines, as one pattern (one search instead of one per verb)."""
    return re.compile("|".join(f"(?:{verb.pattern})" for verb in rp.ATTRIBUTION_VERBS), re.I)


def _separators_and_blocks(lines: Sequence[str]) -> list[QuoteHeader]:
    headers = []
    for index, line in enumerate(lines):
        separator = True if _RULE_LINE.match(line) else _separator_title(lines, index)
        if separator is not None:
            headers.append(QuoteHeader(index, index, separator))
        elif ":" in line or "：" in line:  # noqa: RUF001
            end = _header_block_end(lines, index)
            if end is not None:
                headers.append(QuoteHeader(index, end, True))
    return headers


def _separator_title(lines: Sequence[str], index: int) -> bool | None:
    """For a title between dashes: True when the table knows it or a header block follows,
    the attribution's certainty when it is one (Zoho, Android: "---- Bob wrote ----"), else
    None."""
    title = _DASHED_TITLE.match(lines[index])
    if title is None:
        return None
    if any(pattern.search(title[1]) for pattern in rp.ORIGINAL_MESSAGE):
        return True
    attribution = _attribution_kind(title[1] + ":")
    if attribution is not None:
        return attribution
    below = next((n for n in range(index + 1, len(lines)) if lines[n].strip()), None)
    if below is not None and _header_block_end(lines, below, from_first=False) is not None:
        return True
    return None


def _header_block_end(lines: Sequence[str], index: int, *, from_first: bool = True) -> int | None:
    """The last line of a ``From: / Sent: / To: / Subject:`` block starting at `index`, or None.

    The block starts with a known "From" label (with `from_first`; else any known label) and
    goes on over "Label: value" lines; it needs a second known label, or two more labels and an
    address or a date, so that a person's "Name: … / Phone: …" list is not one. In a language
    no table knows, a "Label: Name <address>" line starts one when two more labels and a date
    or time follow."""
    line = _LINE_DECORATION.sub("", lines[index])
    if _is_from_label(line) or (not from_first and _is_known_label(line)):
        unknown = False
    elif _LABEL_LINE.match(line) and _MAILBOX.search(line):
        unknown = True
    else:
        return None
    end, known, labels, dated, previous = None, 0, 0, False, line
    for later in range(index + 1, min(index + _MAX_BLOCK_LINES, len(lines))):
        candidate = _LINE_DECORATION.sub("", lines[later])
        if _is_known_label(candidate):
            known += 1
        elif _OPEN_MAILBOX.search(previous):
            previous = candidate  # the value wrapped inside a mailbox: "[mailto:\n bob@x]"
            continue
        elif not _LABEL_LINE.match(candidate):
            break
        labels += 1
        previous = candidate
        dated = dated or _DATE_OR_TIME.search(candidate) is not None
        end = later
    if unknown:
        return end if labels >= 2 and dated else None
    evidence = dated or "@" in line
    return end if known >= 1 or (labels >= 2 and evidence) else None


def _is_from_label(line: str) -> bool:
    return _from_labels().match(line) is not None


def _is_known_label(line: str) -> bool:
    return _other_labels().match(line) is not None


@lru_cache(maxsize=1)
def _from_labels() -> re.Pattern[str]:
    """The "From" labels of the forward parser and of the reply tables, as one pattern."""
    labels = [pattern.pattern for pattern in fp.ORIGINAL_FROM]
    labels += [rf"(?i:^\s*(?:{pattern.pattern})\s?[:：](.*)$)" for pattern in rp.HEADER_FROM]  # noqa: RUF001
    return re.compile("|".join(f"(?:{label})" for label in labels), re.M)


@lru_cache(maxsize=1)
def _other_labels() -> re.Pattern[str]:
    """Every other header label known (date, to, cc, subject, reply-to), as one pattern."""
    tables = (
        *fp.ORIGINAL_DATE,
        *fp.ORIGINAL_TO,
        *fp.ORIGINAL_CC,
        *fp.ORIGINAL_SUBJECT,
        *fp.ORIGINAL_REPLY_TO,
        # Yahoo's "Sent:"-style labels, anchored like the others.
        *(re.compile("^" + pattern.pattern, pattern.flags) for pattern in fp.ORIGINAL_DATE_LAX),
    )
    labels = [f"(?i:{p.pattern})" if p.flags & re.I else f"(?:{p.pattern})" for p in tables]
    labels += [rf"(?i:^\s*(?:{pattern.pattern})\s?[:：])" for pattern in rp.HEADER_OTHER]  # noqa: RUF001
    return re.compile("|".join(labels), re.M)
