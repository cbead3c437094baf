"""Context assembly: the newest messages within the budget, and the organization's context."""

from __future__ import annotations

from sessions.context import HistoryMessage, assemble_request, system_prompt_for
from sessions.llm import LLMMessage, estimate_tokens


def user(content: str, tokens: int = 10) -> HistoryMessage:
    return HistoryMessage("user", content, tokens)


def assistant(content: str, tokens: int = 10) -> HistoryMessage:
    return HistoryMessage("assistant", content, tokens)


def contents(history: list[HistoryMessage], budget: int) -> list[str]:
    request = assemble_request(system="sys", history=history, budget_tokens=budget, max_tokens=99)
    return [message.content for message in request.messages]


def test_the_request_carries_the_system_prompt_and_max_tokens() -> None:
    request = assemble_request(
        system="You are kind.", history=[user("hi")], budget_tokens=100, max_tokens=321
    )
    assert request.system == "You are kind."
    assert request.max_tokens == 321
    assert request.messages == (LLMMessage("user", "hi"),)


def test_everything_is_kept_oldest_first_when_it_fits() -> None:
    history = [user("u1"), assistant("a1"), user("u2"), assistant("a2"), user("u3")]
    request = assemble_request(system="s", history=history, budget_tokens=50, max_tokens=1)
    assert [(m.role, m.content) for m in request.messages] == [
        ("user", "u1"),
        ("assistant", "a1"),
        ("user", "u2"),
        ("assistant", "a2"),
        ("user", "u3"),
    ]


def test_the_newest_messages_within_the_budget_are_kept() -> None:
    history = [user("u1"), assistant("a1"), user("u2"), assistant("a2"), user("u3")]
    # 10 tokens each: 30 fits u2, a2, u3 exactly (the budget is inclusive).
    assert contents(history, 30) == ["u2", "a2", "u3"]
    assert contents(history, 39) == ["u2", "a2", "u3"]


def test_the_kept_messages_never_start_with_an_assistant_message() -> None:
    history = [user("u1"), assistant("a1"), user("u2"), assistant("a2"), user("u3")]
    # 40 tokens would fit a1, u2, a2, u3; the leading reply is dropped.
    assert contents(history, 40) == ["u2", "a2", "u3"]
    assert contents(history, 20) == ["u3"]


def test_several_leading_replies_are_all_dropped() -> None:
    history = [user("u1"), assistant("a1"), assistant("a1b"), assistant("a1c"), user("u2")]
    assert contents(history, 40) == ["u2"]


def test_an_older_message_that_would_fit_is_not_taken_after_a_gap() -> None:
    history = [user("tiny", 1), assistant("huge", 100), user("u2", 10), assistant("a2", 10)]
    history.append(user("u3", 10))
    # The history stays contiguous: "tiny" fits the rest of the budget but "huge" stops it.
    assert contents(history, 35) == ["u2", "a2", "u3"]


def test_the_latest_message_is_kept_even_when_it_alone_exceeds_the_budget() -> None:
    history = [user("u1"), assistant("a1"), user("enormous", 10_000)]
    assert contents(history, 50) == ["enormous"]


def test_a_message_without_a_stored_count_costs_its_estimate() -> None:
    long_text = "x" * 400  # about 100 tokens
    assert HistoryMessage("user", long_text).cost == estimate_tokens(long_text) == 100
    assert HistoryMessage("user", long_text, 7).cost == 7
    history = [user(long_text, 0), assistant("a1", 0), user("u2", 0)]
    assert contents(history, 50) == ["u2"]
    assert contents(history, 110) == [long_text, "a1", "u2"]


def test_an_empty_history_gives_no_messages() -> None:
    assert contents([], 100) == []


def test_the_system_prompt_gets_the_organization_context_appended() -> None:
    prompt = system_prompt_for("You are a helpful assistant.", "Acme", "  Acme makes anvils.\n")
    assert prompt == (
        "You are a helpful assistant.\n\nThe user works at Acme. Acme makes anvils."
    )
    assert prompt.startswith("You are a helpful assistant.")


def test_without_organization_context_the_system_prompt_is_unchanged() -> None:
    assert system_prompt_for("Be brief.", "Acme", "") == "Be brief."
    assert system_prompt_for("Be brief.", "Acme", "  \n ") == "Be brief."
