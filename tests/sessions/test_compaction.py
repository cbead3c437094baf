"""Compaction's pure parts: where to cut, when to trigger, the summary's size."""

from __future__ import annotations

from sessions.compaction import CompactionPolicy, split_point
from sessions.context import HistoryMessage


def history(*roles: str, cost: int = 10) -> list[HistoryMessage]:
    return [
        HistoryMessage(seq=index + 1, role=role, content="x", tokens=cost)
        for index, role in enumerate(roles)
    ]


def test_the_kept_part_is_the_last_messages_starting_with_a_user_message() -> None:
    messages = history(*(["user", "assistant"] * 10))
    assert split_point(messages, keep_last=4, max_kept_tokens=1000) == 16
    assert split_point(messages, keep_last=5, max_kept_tokens=1000) == 14  # not on an answer


def test_a_tool_call_is_never_separated_from_its_result() -> None:
    messages = history("user", "assistant", "user", "assistant", "tool", "assistant", "user")
    # Keeping 3 would start on the tool result: the cut moves back to the user message before
    # the call, or, when that would keep too much, forward past the result.
    assert split_point(messages, keep_last=3, max_kept_tokens=1000) == 2
    assert split_point(messages, keep_last=3, max_kept_tokens=45) == 6


def test_fewer_messages_are_kept_when_they_alone_would_be_over_budget() -> None:
    messages = history(*(["user", "assistant"] * 10), cost=100)
    assert split_point(messages, keep_last=20, max_kept_tokens=350) == 18


def test_the_latest_user_message_is_always_kept() -> None:
    messages = history("user", "assistant", "user", cost=1000)
    assert split_point(messages, keep_last=20, max_kept_tokens=10) == 2


def test_trigger_on_tokens_or_on_message_count() -> None:
    policy = CompactionPolicy(budget_tokens=1000, trigger_ratio=0.8, max_messages=200)
    assert not policy.needed(800, 10)
    assert policy.needed(801, 10)
    assert policy.needed(10, 201)
    assert not policy.needed(10, 200)


def test_the_summary_never_takes_more_than_a_quarter_of_the_budget() -> None:
    assert CompactionPolicy(budget_tokens=4000, summary_max_tokens=2000).summary_limit == 1000
    assert CompactionPolicy(budget_tokens=50_000, summary_max_tokens=2000).summary_limit == 2000
    assert CompactionPolicy(budget_tokens=50_000, trigger_ratio=0.8).max_kept_tokens == 20_000
