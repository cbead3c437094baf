"""Context assembly: the newest messages within the budget, the thread first, and the system
prompt with the organization's context, memory and recent conversations."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sessions.context import (
    SUMMARY_LEAD_IN,
    ContextInputs,
    HistoryMessage,
    RecentConversation,
    assemble,
    choose_history,
    system_prompt_for,
)
from sessions.llm import LLMMessage, estimate_tokens


def conversation(*roles: str, tokens: int = 10, thread_id: str = "") -> list[HistoryMessage]:
    """Messages numbered from 1, with contents like `u1`, `a2` (role initial and seq)."""
    return [
        HistoryMessage(seq, role, f"{role[0]}{seq}", tokens, thread_id)
        for seq, role in enumerate(roles, start=1)
    ]


def kept(history: Sequence[HistoryMessage], budget: int, thread_id: str = "") -> list[str]:
    return [message.content for message in choose_history(history, budget, thread_id)]


def inputs(history: Sequence[HistoryMessage], **fields: object) -> ContextInputs:
    values: dict[str, object] = {
        "system_prompt": "You are a helpful assistant.",
        "org_name": "Acme",
        "org_context": "Acme makes anvils.",
        "memory_facts": (),
        "recent_conversations": (),
        "compaction_summary": None,
        "history": history,
    }
    values.update(fields)
    return ContextInputs(**values)  # type: ignore[arg-type]


U_A = ("user", "assistant")


def test_everything_is_kept_oldest_first_when_it_fits() -> None:
    history = conversation(*U_A, *U_A, "user")
    assert kept(history, 50) == ["u1", "a2", "u3", "a4", "u5"]


def test_the_newest_messages_within_the_budget_are_kept() -> None:
    history = conversation(*U_A, *U_A, "user")
    # 10 tokens each: 30 fits u3, a4, u5 exactly (the budget is inclusive).
    assert kept(history, 30) == ["u3", "a4", "u5"]
    assert kept(history, 39) == ["u3", "a4", "u5"]


def test_the_kept_messages_never_start_with_an_assistant_message() -> None:
    history = conversation(*U_A, *U_A, "user")
    # 40 tokens would fit a2, u3, a4, u5; the leading answer is dropped.
    assert kept(history, 40) == ["u3", "a4", "u5"]
    assert kept(history, 20) == ["u5"]


def test_the_kept_messages_never_start_with_a_tool_result() -> None:
    history = conversation("user", "assistant", "tool", "assistant", "user")
    assert kept(history, 30) == ["u5"]
    assert kept(history, 40) == ["u5"]
    assert kept(history, 50) == ["u1", "a2", "t3", "a4", "u5"]


def test_several_leading_answers_are_all_dropped() -> None:
    history = conversation("user", "assistant", "assistant", "assistant", "user")
    assert kept(history, 40) == ["u5"]


def test_an_older_message_that_would_fit_is_not_taken_after_a_gap() -> None:
    history = [
        HistoryMessage(1, "user", "tiny", 1),
        HistoryMessage(2, "assistant", "huge", 100),
        HistoryMessage(3, "user", "u3", 10),
        HistoryMessage(4, "assistant", "a4", 10),
        HistoryMessage(5, "user", "u5", 10),
    ]
    # The history stays contiguous: "tiny" fits what is left but "huge" stops the walk back.
    assert kept(history, 35) == ["u3", "a4", "u5"]


def test_the_latest_message_is_kept_even_when_it_alone_exceeds_the_budget() -> None:
    history = [*conversation(*U_A), HistoryMessage(3, "user", "enormous", 10_000)]
    assert kept(history, 50) == ["enormous"]


def test_an_empty_history_gives_no_messages() -> None:
    assert choose_history([], 100) == []


def test_a_message_without_a_stored_count_costs_its_estimate() -> None:
    long_text = "x" * 400  # about 100 tokens
    assert HistoryMessage(1, "user", long_text).cost == estimate_tokens(long_text) == 100
    assert HistoryMessage(1, "user", long_text, 7).cost == 7
    history = [
        HistoryMessage(1, "user", long_text),
        HistoryMessage(2, "assistant", "a2"),
        HistoryMessage(3, "user", "u3"),
    ]
    assert kept(history, 50) == ["u3"]
    assert kept(history, 110) == [long_text, "a2", "u3"]


def test_in_a_thread_the_threads_messages_come_first_in_the_budget() -> None:
    history = [
        HistoryMessage(1, "user", "thread question", 10, "t-1"),
        HistoryMessage(2, "assistant", "thread answer", 10, "t-1"),
        HistoryMessage(3, "user", "other question", 10),
        HistoryMessage(4, "assistant", "other answer", 10),
        HistoryMessage(5, "user", "back in the thread", 10, "t-1"),
    ]
    assert kept(history, 30, "t-1") == ["thread question", "thread answer", "back in the thread"]
    assert kept(history, 30) == ["other question", "other answer", "back in the thread"]
    assert len(kept(history, 50, "t-1")) == 5


def test_assemble_builds_the_request_in_order_and_counts_the_history() -> None:
    history = conversation(*U_A, *U_A, "user")
    assembled = assemble(inputs(history), budget_tokens=30, max_tokens=321)

    assert assembled.request.max_tokens == 321
    assert assembled.request.messages == (
        LLMMessage("user", "u3"),
        LLMMessage("assistant", "a4"),
        LLMMessage("user", "u5"),
    )
    assert assembled.history_tokens == 30
    assert assembled.dropped_messages == 2
    assert assembled.request.system == (
        "You are a helpful assistant.\n\nThe user works at Acme. Acme makes anvils."
    )


def test_a_tool_result_is_sent_with_the_user_role_and_its_blocks() -> None:
    blocks = ({"type": "tool_result", "tool_use_id": "x", "content": "42"},)
    history = [
        *conversation("user"),
        HistoryMessage(2, "tool", "[tool result: 42]", 10, blocks=blocks),
        HistoryMessage(3, "user", "and then?", 10),
    ]
    messages = assemble(inputs(history), budget_tokens=100, max_tokens=10).request.messages
    assert messages[1] == LLMMessage("user", blocks)


def test_the_compaction_summary_comes_first_and_counts_against_the_budget() -> None:
    history = conversation(*U_A, *U_A, "user")
    summary = "- the user likes anvils"
    block = f"<summary>\n{summary}\n</summary>"
    summary_cost = estimate_tokens(block) + estimate_tokens(SUMMARY_LEAD_IN)

    assembled = assemble(
        inputs(history, compaction_summary=summary),
        budget_tokens=summary_cost + 30,
        max_tokens=10,
    )

    assert assembled.request.messages[:2] == (
        LLMMessage("user", SUMMARY_LEAD_IN),
        LLMMessage("assistant", block),
    )
    assert [m.content for m in assembled.request.messages[2:]] == ["u3", "a4", "u5"]
    assert assembled.history_tokens == summary_cost + 30


def test_the_system_prompt_carries_memory_and_recent_conversations_after_the_org() -> None:
    recent = RecentConversation("abcdef1234567890", datetime(2025, 5, 4, tzinfo=UTC), "Anvils.")
    assembled = assemble(
        inputs(
            conversation("user"),
            memory_facts=("Prefers short answers.",),
            recent_conversations=(recent,),
        ),
        budget_tokens=100,
        max_tokens=10,
    )
    assert assembled.request.system == (
        "You are a helpful assistant.\n\nThe user works at Acme. Acme makes anvils."
        "\n\nWhat you know about the user:\n- Prefers short answers."
        "\n\nRecent conversations:\n- 2025-05-04 (session abcdef12): Anvils."
    )


def test_the_system_prompt_gets_the_organization_context_appended() -> None:
    prompt = system_prompt_for("You are a helpful assistant.", "Acme", "  Acme makes anvils.\n")
    assert prompt == "You are a helpful assistant.\n\nThe user works at Acme. Acme makes anvils."


def test_without_organization_context_the_system_prompt_is_unchanged() -> None:
    assert system_prompt_for("Be brief.", "Acme", "") == "Be brief."
    assert system_prompt_for("Be brief.", "Acme", "  \n ") == "Be brief."
