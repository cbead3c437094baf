"""The end of a reply that the person did not write: an RFC 3676 signature (below a ``-- ``
line), the line a mobile or desktop client appends ("Sent from my iPhone", "Von meinem iPhone
gesendet", "Get Outlook for iOS"), and the invisible characters some clients and trackers add.

Other signatures are kept: a greeting such as "Thanks," or a name too often ends what someone
wrote. The client phrases are tables per language (`channels.email.reply_patterns`); a line
counts only when it is one of them and names a device or a mail app.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from mailparser_reply.constants import MAIL_LANGUAGES  # type: ignore[import-untyped]

from channels.email import reply_patterns as rp

_SIGNATURE_DELIMITER = re.compile(r"^--\s?$")
_MAX_SIGNATURE_LINES = 15
_MAX_CLIENT_LINE_WORDS = 12
# A link the client appends to its line ("…for iOS<https://aka.ms/o0ukef>"), and decorations.
_LINK = re.compile(r"\s*(?:<https?://[^>]*>|\[https?://[^\]]*\]|\(https?://[^)]*\)|https?://\S+)")
_CLAUSE_END = re.compile(r"[,;]|\.\s")
_DECORATION = " \t*_-–—~<>()[].!•·"  # noqa: RUF001 (dashes of several widths)


def remove_invisible(text: str) -> str:
    """`text` without zero-width and other invisible characters (emoji joiners stay)."""
    return rp.LONE_JOINER.sub("", rp.INVISIBLE.sub("", text))


def without_signature(lines: Sequence[str]) -> list[str]:
    """`lines` without a ``-- `` signature near the end and trailing client lines."""
    kept = list(lines)
    for index, line in enumerate(kept):
        if _SIGNATURE_DELIMITER.match(line) and len(kept) - index <= _MAX_SIGNATURE_LINES:
            kept = kept[:index]
            break
    while (last := _last_non_blank(kept)) is not None and is_client_line(kept[last]):
        kept = kept[:last]
    return kept


def is_client_line(line: str) -> bool:
    """Whether `line` is a mail client's own signature ("Sent from my iPhone")."""
    text = _LINK.sub("", line).strip(_DECORATION)
    if not text or len(text.split()) > _MAX_CLIENT_LINE_WORDS:
        return False
    if _mail_parser_reply_line().match(text):
        return True
    # The device comes before any pause: "Sent from my desk, … mobile phone." is a sentence.
    head = _CLAUSE_END.split(text, maxsplit=1)[0]
    return rp.MOBILE_DEVICES.search(head) is not None and any(
        pattern.fullmatch(text) for pattern in rp.MOBILE_SIGNATURES
    )


@lru_cache(maxsize=1)
def _mail_parser_reply_line() -> re.Pattern[str]:
    """mail-parser-reply's "Sent from my …" phrases (they need no device name)."""
    phrases = [entry["sent_from"] for entry in MAIL_LANGUAGES.values() if entry.get("sent_from")]
    alternatives = "|".join(f"(?:{phrase})" for phrase in phrases)
    return re.compile(rf"^\s*(?:{alternatives}|Sent with \w+)[\w.<>:/()' -]{{0,60}}$", re.I)


def _last_non_blank(lines: Sequence[str]) -> int | None:
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].strip():
            return index
    return None
