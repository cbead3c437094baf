"""The dates a recall query names (`dates_named`): "what did Maria start, as mentioned on
3 June, 2023?", "which city did John recommend in January 2024?". Turns written within them
are boosted (`sessions.recall_ranking.boost_by_dates`).

English dates only, written out: a day and a month with or without a year ("3 June, 2023",
"June 3rd 2023", "3rd of June", "June 3"), a month and a year ("January 2024"), a month alone
after "in", "during" or "since" ("in May"), or ISO ("2023-06-03"). Two dates "between … and
…" or "from … to …" are one period. A date without a year takes the year another date of
the query writes ("between August 11 and August 15, 2023"), else it is the latest such day
(or month) not after `today`. A day spans a day either side (the index keeps times in UTC,
the user's day may be another); a month, the whole month. Bare years and relative dates
("last week") are not read: a year is too wide to rank by, and "last week" says nothing of
when the question is asked about.

A handful of regular expressions rather than `dateparser`'s `search_dates`, which reads
dates into ordinary words ("may", "march", "sat") and costs milliseconds a query.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

_MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_PATTERNS = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\b(?P<iso>(?:19|20)\d\d)-(?P<isomonth>[01]\d)-(?P<isoday>[0-3]\d)\b",
        rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b",
        rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b",
        rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\b(?!\s*,?\s*\d)",
        rf"\b{_MONTH}\s+{_DAY}\b(?!\s*,?\s*\d)",
        rf"\b{_MONTH},?\s+{_YEAR}\b",
        rf"\b(?:in|during|since)\s+{_MONTH}\b(?!\s*,?\s*\d)",
    )
]
# A month's name as a word of its own: every pattern but the first (ISO) holds one. Most
# queries name no month, and one scan for it (a letter a month begins with, looked ahead
# before trying the names) costs a tenth of trying the six month patterns at every word. A
# word that only starts like a month ("decision", "market", "separate") is not one: the
# patterns would find nothing in it, at 50-90 µs a query.
_MONTH_WORD = re.compile(
    r"\b(?=[adfjmnos])(?:" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")(?![a-z])",
    re.IGNORECASE,
)
_RANGE_GAP = re.compile(r"\s*(?:and|to|until|till|through|-|\u2013)\s*", re.IGNORECASE)
_RANGE_START = re.compile(r"\b(?:between|from)\s+(?:the\s+)?$", re.IGNORECASE)
DAY_MARGIN = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class DateSpan:
    """A period a query names: from `start` (included) to `end` (excluded), in UTC."""

    start: datetime
    end: datetime

    def holds(self, moment: datetime) -> bool:
        return self.start <= moment < self.end


def dates_named(query: str, today: date) -> tuple[DateSpan, ...]:
    """The periods the query names, in the order written (see the module docstring)."""
    return named_by(query, today, _PATTERNS if _MONTH_WORD.search(query) else _PATTERNS[:1])


def named_by(
    query: str, today: date, patterns: Sequence[re.Pattern[str]] = _PATTERNS
) -> tuple[DateSpan, ...]:
    """The periods `patterns` find in the query (`dates_named` leaves out those that cannot
    match it)."""
    matches: list[re.Match[str]] = []
    for pattern in patterns:
        for match in pattern.finditer(query):
            if not any(m.start() < match.end() and match.start() < m.end() for m in matches):
                matches.append(match)
    matches.sort(key=lambda match: match.start())
    # "between August 11 and August 15, 2023": the year written once holds for both.
    years = [_year(match) for match in matches if _year(match)]
    spans: list[DateSpan] = []
    for index, match in enumerate(matches):
        span = _span(match, today, years[0] if years else 0)
        if span is None:
            continue
        if index and spans and _joined(query, matches[index - 1], match):
            span = DateSpan(spans.pop().start, span.end)
        spans.append(span)
    return tuple(spans)


def _year(match: re.Match[str]) -> int:
    found = match.groupdict()
    return int(found.get("iso") or found.get("year") or 0)


def _joined(query: str, first: re.Match[str], second: re.Match[str]) -> bool:
    """Whether two dates are the ends of one period: "between … and …", "from … to …"."""
    return bool(
        _RANGE_GAP.fullmatch(query[first.end() : second.start()])
        and _RANGE_START.search(query[: first.start()])
    )


def _span(match: re.Match[str], today: date, year_hint: int) -> DateSpan | None:
    found = match.groupdict()
    if found.get("iso"):
        year, month, day = int(found["iso"]), int(found["isomonth"]), int(found["isoday"])
    else:
        month = _month(found["month"])
        year = int(found["year"]) if found.get("year") else year_hint
        day = int(found["day"]) if found.get("day") else 0
    try:
        if not day:
            if not year:
                year = today.year if month <= today.month else today.year - 1
            first = date(year, month, 1)
            after = date(year + month // 12, month % 12 + 1, 1)
            return DateSpan(_midnight(first), _midnight(after))
        named = date(year, month, day) if year else _latest(month, day, today)
    except ValueError:  # "31 June", "29 February 2023"
        return None
    return DateSpan(
        _midnight(named) - DAY_MARGIN, _midnight(named) + timedelta(days=1) + DAY_MARGIN
    )


def _month(name: str) -> int:
    """The number of the month a pattern matched. The patterns ignore case as Unicode does,
    so a name may hold a letter that only folds to its own (a long s, a dotted capital I)."""
    number = _MONTHS.get(name.casefold())
    if number is None:
        number = next(n for key, n in _MONTHS.items() if re.fullmatch(key, name, re.IGNORECASE))
    return number


def _latest(month: int, day: int, today: date) -> date:
    """The latest `day` of `month` not after `today` (29 February: within eight years)."""
    for year in range(today.year, today.year - 8, -1):
        try:
            named = date(year, month, day)
        except ValueError:
            continue
        if named <= today:
            return named
    raise ValueError(f"no {day}/{month} in the last eight years")


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


# A question that asks when: "When did …", "since when was …", "what date …", "how long ago …".
_ASKS_WHEN = re.compile(
    r"^\s*when\b|\b(?:since\s+)?when\s+(?:did|was|were|is|are|will|do|does|had|has|have)\b"
    r"|\bwhat\s+(?:date|day|year|month|time)\b|\bhow\s+long\s+ago\b",
    re.IGNORECASE,
)
# A text that says when: a date's words, a weekday, a year, "yesterday", "ago", "last week"…
_SAYS_WHEN = re.compile(
    r"\b(?:yesterday|today|tonight|tomorrow|ago|weekends?|recently|lately|earlier"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday"
    r"|january|february|march|april|june|july|august|september|october|november|december"
    r"|(?:19|20)\d\d"
    r"|(?:last|next|this|past|few|couple\s+of)\s+(?:\w+\s+)?"
    r"(?:days?|nights?|weeks?|weekends?|months?|years?|summer|winter|spring|fall|autumn"
    r"|morning|evening|time))\b",
    re.IGNORECASE,
)


def asks_when(query: str) -> bool:
    """Whether a query asks when something happened ("when did we ship it?")."""
    return _ASKS_WHEN.search(query) is not None


def says_when(text: str) -> bool:
    """Whether a text tells a time: a month, a weekday, a year, "yesterday", "two weeks ago",
    "last summer"… ("May" is left out: it is a verb as often as a month)."""
    return _SAYS_WHEN.search(text) is not None
