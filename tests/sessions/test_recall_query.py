"""Which speakers a recall query asks about (`sessions.recall_query.asked_about`): the ones
it names as its subject, not those it names after "to", "with", "about"… or only as owners;
and which words of a long message are searched (`query_terms`)."""

from __future__ import annotations

import pytest

from sessions.recall_query import MAX_QUERY_TERMS, asked_about, names_and_numbers, query_terms

SPEAKERS = ("Tim", "John", "Caroline Smith", "Melanie")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("What did Melanie research?", {"Melanie"}),
        ("What did Joanna recommend to Tim?", {"Tim"}),
        ("What did Tim recommend to John?", {"Tim"}),
        ("How did Tim feel about sharing desserts with John?", {"Tim"}),
        ("What does Melanie think about Caroline's decision?", {"Melanie"}),
        ("What do Melanie's kids like?", {"Melanie"}),
        ("What movies have both Tim and John seen?", {"Tim", "John"}),
        ("Who is Tim and John's favorite basketball player?", {"Tim", "John"}),
        ("What did Caroline Smith say to Tim and John?", {"Caroline Smith"}),
        ("Did Tim write to Caroline Smith?", {"Tim"}),
        ("What did they give to Tim, John and Melanie?", {"Tim", "John", "Melanie"}),
        ("What did Melanie\u2019s brother give to Tim?", {"Melanie"}),
        ("What is the weather like?", set()),
    ],
)
def test_the_speakers_a_query_asks_about(query: str, expected: set[str]) -> None:
    assert asked_about(query, SPEAKERS) == expected


def test_a_name_that_is_a_stopword_is_not_looked_for() -> None:
    assert asked_about("What will we do?", ["Will", "Tim"]) == set()
    assert asked_about("What will Tim do?", ["Will", "Tim"]) == {"Tim"}


def test_without_roles_every_speaker_named_counts() -> None:
    query = "What did Melanie recommend to Tim?"
    assert asked_about(query, SPEAKERS, roles=False) == {"Melanie", "Tim"}
    assert asked_about(query, []) == set()


def test_a_long_message_keeps_its_names_and_numbers_among_the_words_searched() -> None:
    filler = " ".join(f"word{first}{second}" for first in "abc" for second in "defghijklmnop")
    message = f"Thanks. {filler} more plain words here again. Where is the Halvorsen renewal?"
    terms = query_terms(message)
    assert len(terms) == MAX_QUERY_TERMS
    assert "halvorsen" in terms
    # The other words keep their order, from the start; "where" begins a sentence.
    assert terms[0] == "thanks"
    assert "where" not in names_and_numbers(message)
