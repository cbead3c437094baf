"""Finds a forwarded message written inline in a mail body (Gmail, Outlook, Apple Mail, …).

A port of the approach of the MIT-licensed crisp-oss/email-forward-parser (JavaScript; its
Python port needs Python 3.14): split the body at a client's forward separator, then read the
original's From, To, Cc, Subject and Date from the header block under it, in ~25 languages. The
patterns live in `channels.email.forward_patterns`. `read_forward` mirrors upstream's `read`,
so upstream's test corpus applies, with one deliberate difference when a subject is given:

* upstream: a subject without a forward prefix (``Fwd:``, ``FW:``, ``WG:`` …) means "not
  forwarded", without looking at the body;
* here: a reply subject (``Re:``, ``AW:`` …) still means "not forwarded" (Outlook's quoted
  reply header looks like a forward), but any other subject still lets the separators that only
  forwards use (``---------- Forwarded message ---------``, ``Begin forwarded message:``) count,
  since people edit the subject of what they forward.

All patterns run on bounded text: the caller caps the body's size and line lengths.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from channels.email import forward_patterns as p

_REPLY_SUBJECT = re.compile(r"^\s*(re|aw|sv|vs|antw|odp|ynt|r|res|rif|ref|vá|atb)\s*:", re.I)

Match = list[str | None]
"""A match as JavaScript returns it: the whole match, then each group (None when unset)."""


@dataclass(frozen=True, slots=True)
class Mailbox:
    """One address of the forwarded header block; either part may be missing."""

    address: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ForwardResult:
    """What `read_forward` found: whether the body forwards a message, the note above it, and
    the original's headers and body."""

    forwarded: bool
    message: str | None = None
    subject: str | None = None
    date: str | None = None
    body: str | None = None
    sender: Mailbox = field(default_factory=Mailbox)
    to: tuple[Mailbox, ...] = ()
    cc: tuple[Mailbox, ...] = ()


def read_forward(body: str, subject: str | None = None) -> ForwardResult:
    """The forward in `body`, if any; `subject` is the outer mail's subject when known."""
    forward_subject = _forward_subject(subject) if subject is not None else None
    flagged = forward_subject is not None
    if subject is not None and not flagged and _REPLY_SUBJECT.match(subject):
        return ForwardResult(forwarded=False)
    separators = _SEPARATOR_LINES if subject is None or flagged else _FORWARD_ONLY_LINES
    body = _normalise(body)
    split = _split_body(body, separators, flagged=flagged)
    if split is None:
        return ForwardResult(forwarded=flagged)
    message, text = split
    original = _strip_quote_marks(text)
    return ForwardResult(
        forwarded=True,
        message=message,
        subject=forward_subject or _original_subject(original),
        date=_original_date(original, body),
        body=_original_body(original),
        sender=_original_from(original, body),
        to=_original_recipients(original, p.ORIGINAL_TO, p.ORIGINAL_TO_LAX, clean_cc=True),
        cc=_original_recipients(original, p.ORIGINAL_CC, p.ORIGINAL_CC_LAX, clean_cc=False),
    )


def _line_patterns(patterns: Sequence[re.Pattern[str]]) -> p.Patterns:
    """The same patterns capturing their whole match too, so a split keeps the separator line
    (needed to rebuild nested forwards)."""
    return tuple(re.compile(f"({pattern.pattern})", pattern.flags) for pattern in patterns)


_SEPARATOR_LINES = _line_patterns(p.FORWARD_ONLY_SEPARATOR + p.OUTLOOK_SEPARATOR)
_FORWARD_ONLY_LINES = _line_patterns(p.FORWARD_ONLY_SEPARATOR)
_SUBJECT_LINES = _line_patterns(p.ORIGINAL_SUBJECT)
_BODY_START_LINES = (
    _SUBJECT_LINES,
    _line_patterns(p.ORIGINAL_CC),
    _line_patterns(p.ORIGINAL_TO),
    _line_patterns(p.ORIGINAL_REPLY_TO),
    _line_patterns(p.ORIGINAL_DATE),  # MailMate puts the Date last
)
_ANY_SUBJECT_LINES = _SUBJECT_LINES + _line_patterns(p.ORIGINAL_SUBJECT_LAX)


def _normalise(body: str) -> str:
    body = body.replace("\r\n", "\n").replace("\ufeff", "")
    body = re.sub("\u00a0$", "", body, flags=re.M)  # IONOS
    return body.replace("\u00a0", " ")  # HubSpot


def _forward_subject(subject: str) -> str | None:
    found = _loop_match(p.SUBJECT, subject)
    if found is None:
        # Upstream's prefixes as people and gateways also write them: "FWD:", "TR :", after
        # a tag such as "[EXT]".
        loose = p.SUBJECT_LOOSE.match(subject)
        return None if loose is None else _trim(loose[1]) or ""
    return _trim(found[1]) or ""


def _split_body(
    body: str, separators: Sequence[re.Pattern[str]], *, flagged: bool
) -> tuple[str | None, str] | None:
    """(the note above the forward, the forwarded text), or None when there is no forward."""
    pieces = _loop_split(separators, body)
    if pieces is not None and len(pieces) > 2:
        # [note, separator line, text, separator line, text …]: nested forwards stay in the text.
        email = _trim(_rejoin(pieces, 3, (2,)))
        if email is not None:
            return _trim(pieces[0]), email
    if flagged:
        # New Outlook 2019 writes no separator: split at the original's From line, which is
        # only safe once the subject said the mail is a forward.
        pieces = _loop_split(p.ORIGINAL_FROM, body)
        if pieces is not None and len(pieces) > 3:
            email = _trim(_rejoin(pieces, 4, (1, 3), skip_value_groups=True))
            if email is not None:
                return _trim(pieces[0]), email
    return None


def _rejoin(
    pieces: Match, size: int, first: Sequence[int], *, skip_value_groups: bool = False
) -> str:
    """Upstream's reconciliateSplitMatch: the pieces after the first split point, joined back,
    leaving out each later match's captured value when asked to."""
    text = "".join(pieces[index] or "" for index in first)
    for index in range(size, len(pieces)):
        if not (skip_value_groups and index % 3 == 2):
            text += pieces[index] or ""
    return text


def _strip_quote_marks(text: str) -> str:
    text = text.replace("\ufeff", "")
    text = p.QUOTE_LINE_BREAK.sub("", text)
    text = p.QUOTE.sub("", text)
    return p.FOUR_SPACES.sub("", text)


def _original_body(text: str) -> str:
    for patterns in _BODY_START_LINES:
        pieces = _loop_split(patterns, text)
        # The header block ends with a blank line (Apple Mail, Gmail, Outlook Live).
        if pieces is not None and len(pieces) > 3 and (pieces[3] or "").startswith("\n\n"):
            return _trim(_rejoin(pieces, 4, (3,), skip_value_groups=True)) or ""
    pieces = _loop_split(_ANY_SUBJECT_LINES, text)
    if pieces is not None and len(pieces) > 3:  # New Outlook 2019, Yahoo: no blank line
        return _trim(_rejoin(pieces, 4, (3,), skip_value_groups=True)) or ""
    return text.strip()  # Outlook 2019: no header block at all


def _original_from(text: str, body: str) -> Mailbox:
    boxes = _mailboxes(p.ORIGINAL_FROM, text)
    if boxes and (boxes[0].address or boxes[0].name):
        return boxes[0]
    found = _loop_match(p.SEPARATOR_WITH_INFORMATION, body, named=True)
    if found is not None:
        return _mailbox(found[2], found[1])
    found = _loop_match(p.ORIGINAL_FROM_LAX, text)
    if found is not None:
        return _mailbox(found[3], found[2])
    return Mailbox()


def _original_recipients(
    text: str, strict: p.Patterns, lax: p.Patterns, *, clean_cc: bool
) -> tuple[Mailbox, ...]:
    boxes = _mailboxes(strict, text)
    if boxes:
        return boxes
    # Yahoo Mail runs Subject, Date (and Cc) into the same line: remove them, then try again.
    cleaned = _loop_replace(p.ORIGINAL_SUBJECT_LAX, text)
    cleaned = _loop_replace(p.ORIGINAL_DATE_LAX, cleaned)
    if clean_cc:
        cleaned = _loop_replace(p.ORIGINAL_CC_LAX, cleaned)
    return _mailboxes(lax, cleaned)


def _original_subject(text: str) -> str | None:
    for patterns in (p.ORIGINAL_SUBJECT, p.ORIGINAL_SUBJECT_LAX):
        found = _loop_match(patterns, text)
        if found is not None:
            return _trim(found[1])
    return None


def _original_date(text: str, body: str) -> str | None:
    found = _loop_match(p.ORIGINAL_DATE, text)
    if found is not None:
        return _trim(found[1])
    found = _loop_match(p.SEPARATOR_WITH_INFORMATION, body, named=True)
    if found is not None:
        return _trim(found[3])
    found = _loop_match(p.ORIGINAL_DATE_LAX, _loop_replace(p.ORIGINAL_SUBJECT_LAX, text))
    return _trim(found[1]) if found is not None else None


def _mailboxes(patterns: p.Patterns, text: str) -> tuple[Mailbox, ...]:
    """The mailboxes on the first line any of `patterns` finds (upstream's __parseMailbox)."""
    found = _loop_match(patterns, text)
    line = _trim(found[-1]) if found is not None else None
    boxes: list[Mailbox] = []
    while line:
        box = _loop_match(p.MAILBOX, line)
        if box is None:
            boxes.append(_mailbox(line, None))
            break
        boxes.append(_mailbox(box[2], box[1]) if len(box) == 3 else _mailbox(box[1], None))
        line = _trim(line.replace(box[0] or "", "", 1))
        if line and line[0] in p.MAILBOX_SEPARATORS:
            line = _trim(line[1:])
    return tuple(boxes)


def _mailbox(address: str | None, name: str | None) -> Mailbox:
    """Upstream's __prepareMailbox: an "address" that is not one is the name."""
    address, name = _trim(address), _trim(name)
    if address is None or not p.MAILBOX_ADDRESS.match(address):
        address, name = None, address
    return Mailbox(address, name if name != address else None)


def _loop_match(
    patterns: Sequence[re.Pattern[str]], text: str, *, named: bool = False
) -> Match | None:
    """The earliest match of any pattern (the first pattern wins a tie), as JavaScript's
    `match` returns it; with `named`, the groups are (from_name, from_address, date)."""
    best: re.Match[str] | None = None
    for pattern in patterns:
        current = pattern.search(text)
        if current is not None and (best is None or best.start() > current.start()):
            best = current
    if best is None:
        return None
    if named:
        return [best.group(0), best["from_name"], best["from_address"], best["date"]]
    return [best.group(0), *best.groups()]


def _loop_split(patterns: Sequence[re.Pattern[str]], text: str) -> Match | None:
    """Upstream's split mode: of the patterns that split the text, the one whose first piece
    is shortest (the earliest split point); the first pattern wins a tie."""
    best: Match | None = None
    for pattern in patterns:
        pieces: Match = list(pattern.split(text))
        if len(pieces) > 1 and (best is None or len(best[0] or "") > len(pieces[0] or "")):
            best = pieces
    return best


def _loop_replace(patterns: Sequence[re.Pattern[str]], text: str) -> str:
    """Remove the first occurrence of the first pattern that occurs."""
    for pattern in patterns:
        replaced = pattern.sub("", text, count=1)
        if len(replaced) < len(text):
            return replaced
    return text


def _trim(value: str | None) -> str | None:
    stripped = (value or "").strip()
    return stripped or None
