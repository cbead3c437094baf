"""The dates a recall query names (`sessions.recall_dates.dates_named`)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from sessions.recall_dates import DateSpan, asks_when, dates_named, named_by, says_when

TODAY = date(2026, 11, 27)
LOCOMO = Path(__file__).resolve().parents[2] / ".." / "shared" / "bench-data" / "locomo"


def days(start: str, end: str) -> DateSpan:
    """The span from the midnight (UTC) starting `start` to the one starting `end`."""
    return DateSpan(
        datetime.fromisoformat(start).replace(tzinfo=UTC),
        datetime.fromisoformat(end).replace(tzinfo=UTC),
    )


QUERIES = [
    # A day spans a day either side; a month, the month.
    ("What did Maria start, as mentioned on 3 June, 2023?", [days("2023-06-02", "2023-06-05")]),
    ("What did she paint on October 13, 2023?", [days("2023-10-12", "2023-10-15")]),
    ("the 3rd of June 2023", [days("2023-06-02", "2023-06-05")]),
    ("Sept. 30th, 2024", [days("2024-09-29", "2024-10-02")]),
    ("the call on 2024-02-29", [days("2024-02-28", "2024-03-02")]),
    ("Which city did he recommend in January 2024?", [days("2024-01-01", "2024-02-01")]),
    ("in December 2025", [days("2025-12-01", "2026-01-01")]),
    # Letters that match a month's only as Unicode ignores case: a long s, a dotted I.
    ("the 2nd of \u017feptember 2023", [days("2023-09-01", "2023-09-04")]),
    ("in apr\u0130l 2024", [days("2024-04-01", "2024-05-01")]),
    # Without a year: the latest such day not after today.
    ("what did we decide on March 3rd?", [days("2026-03-02", "2026-03-05")]),
    ("dec 5", [days("2025-12-04", "2025-12-07")]),
    ("on 29 February", [days("2024-02-28", "2024-03-02")]),
    ("Which spot did she visit in May?", [days("2026-05-01", "2026-06-01")]),
    ("since December", [days("2025-12-01", "2026-01-01")]),
    # A year written once holds for both dates; "between … and …" is one period.
    ("Where was he between August 11 and August 15 2023?", [days("2023-08-10", "2023-08-17")]),
    ("from 3 June to 5 June, 2024", [days("2024-06-02", "2024-06-07")]),
    (
        "on August 11 and on August 20, 2023",
        [days("2023-08-10", "2023-08-13"), days("2023-08-19", "2023-08-22")],
    ),
    # Two dates, in the order written.
    (
        "May 2023 or 1 May 2024",
        [days("2023-05-01", "2023-06-01"), days("2024-04-30", "2024-05-03")],
    ),
    # No date: words that are month names, impossible days, bare years.
    ("I may go, and march on", []),
    ("Decide on the market's separate novel augmented junctions", []),
    ("31 June 2023", []),
    ("back in 2023", []),
    ("what is the plan?", []),
]


@pytest.mark.parametrize(("query", "expected"), QUERIES)
def test_the_dates_a_query_names(query: str, expected: list[DateSpan]) -> None:
    assert list(dates_named(query, TODAY)) == expected


def test_a_span_holds_its_start_not_its_end() -> None:
    span = days("2023-06-02", "2023-06-05")
    assert span.holds(datetime(2023, 6, 2, tzinfo=UTC))
    assert span.holds(datetime(2023, 6, 4, 23, 59, tzinfo=UTC))
    assert not span.holds(datetime(2023, 6, 5, tzinfo=UTC))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("When did Melanie go camping?", True),
        ("  when was the launch", True),
        ("And when did we ship it?", True),
        ("Since when is the office closed?", True),
        ("What date is the review?", True),
        ("How long ago did Tim move?", True),
        ("What did Tim say when we met?", False),
        ("Call me when you can", False),
        ("What is the plan?", False),
    ],
)
def test_a_question_that_asks_when(query: str, expected: bool) -> None:
    assert asks_when(query) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("We went camping last weekend.", True),
        ("I signed up two weeks ago.", True),
        ("It opened on Friday.", True),
        ("Back in 2019 we moved.", True),
        ("See you tomorrow!", True),
        ("The review is in October.", True),
        ("We had a blast last year at the Pride fest.", True),
        ("I may go, I love painting.", False),
        ("Thanks, that sounds great!", False),
    ],
)
def test_a_text_that_says_when(text: str, expected: bool) -> None:
    assert says_when(text) is expected


MONTH_QUERIES = [
    "In SEPT. 2023 we met",
    "(jan 5) and Feb, 2024",
    "what happened during\tApril?",
    "octopus or november? December 1st 2020, nov 30",
    "from the 3rd of June until 5 June",
    "mayor of Marchington in Augusta",
    "2024-02-29 or Jun 2",
]


def test_dates_named_finds_what_every_pattern_finds() -> None:
    """`dates_named` tries the month patterns only where a month's name starts: it finds
    what all the patterns find, in questions with and without months (and LoCoMo's
    questions when `../shared` has them)."""
    queries = [query for query, _ in QUERIES] + MONTH_QUERIES
    if (LOCOMO / "locomo_dev.json").is_file():
        samples = json.loads((LOCOMO / "locomo_dev.json").read_text(encoding="utf-8"))
        queries += [qa["question"] for sample in samples for qa in sample["qa"]]
    for query in queries:
        assert dates_named(query, TODAY) == named_by(query, TODAY), query
    assert any(named_by(query, TODAY) for query in MONTH_QUERIES)
