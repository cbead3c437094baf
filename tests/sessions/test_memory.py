"""Memory facts and session summaries: parsing the model's answers, deduplication, retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sessions.llm import TokenEstimator, offline_facts, offline_summary, offline_topic
from sessions.memory import MemoryFact, RetentionPolicy, SessionSummary, parse_facts
from sessions.topics import parse_topic

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_facts_are_read_from_a_json_answer_even_with_prose_around_it() -> None:
    answer = 'Here you go:\n[{"category": "preference", "fact": "Prefers  tea."}, {"fact": 3}]'
    assert parse_facts(answer) == [MemoryFact("preference", "Prefers tea.")]
    assert parse_facts("no json here") == []
    assert parse_facts("[not json]") == []
    assert parse_facts('[{"category": "weird", "fact": "x"}]') == [MemoryFact("fact", "x")]


def test_the_same_fact_written_differently_has_one_key() -> None:
    assert MemoryFact("fact", "Likes  TEA!").key == MemoryFact("preference", "likes tea").key
    assert MemoryFact("fact", "likes tea").key != MemoryFact("fact", "likes coffee").key


def test_retention_keeps_the_newest_three_of_the_last_fourteen_days() -> None:
    summaries = [
        SessionSummary(f"s{days}", "x", NOW - timedelta(days=days)) for days in (1, 2, 3, 4, 20)
    ]
    assert [s.session_id for s in RetentionPolicy().select(summaries, NOW)] == ["s1", "s2", "s3"]
    assert RetentionPolicy(hot_limit=10).select(summaries, NOW)[-1].session_id == "s4"


def test_topic_answers_are_parsed_and_bounded() -> None:
    summary, topics = parse_topic('{"summary": "Budget  review.", "topics": ["a","b",1,"c"]}')
    assert (summary, topics) == ("Budget review.", ["a", "b", "c"])
    assert parse_topic("nonsense") == ("", [])


def test_token_estimates_follow_what_the_api_counts() -> None:
    estimator = TokenEstimator()
    for _ in range(30):
        estimator.observe(100, 150)
    assert 145 <= estimator.estimate(100) <= 150


def test_the_offline_model_answers_bookkeeping_calls_in_the_asked_format() -> None:
    prompt = (
        "<previous_summary>\n- Earlier point\n</previous_summary>\n\n<transcript>\n"
        "user: My name is Dana. I prefer short answers.\nassistant: Noted.\n"
        "user: We decided to ship on Friday.\n</transcript>"
    )
    assert offline_summary(prompt, max_chars=1000).splitlines() == [
        "- Earlier point",
        "- My name is Dana.",
        "- We decided to ship on Friday.",
    ]
    assert offline_facts(prompt) == [
        {"category": "identity", "fact": "My name is Dana."},
        {"category": "preference", "fact": "I prefer short answers."},
        {"category": "commitment", "fact": "We decided to ship on Friday."},
    ]
    assert offline_topic(prompt)["summary"] == "My name is Dana."
