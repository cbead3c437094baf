"""A recalled passage longer than the room it gets shows the part about the question: the
window with the most of the question's words (names and numbers first), cut at word
boundaries, with "…" where the passage goes on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sessions.recall_excerpt import ELLIPSIS, excerpt, question_weights

LONG = (
    "I would summarise it in three points and put the open questions for legal at the end. "
    "Please keep the tone friendly but firm, since the team asked for a decision by Friday "
    "and we have a lot to cover before then. The Halvorsen renewal still waits for their "
    "procurement sign-off."
)


def test_a_passage_that_fits_is_shown_whole_with_its_spaces_made_single() -> None:
    assert excerpt("Acme  invoice\n7 was paid.", question_weights("Acme?"), 400) == (
        "Acme invoice 7 was paid."
    )


def test_the_part_that_names_what_the_question_asks_about_is_shown() -> None:
    question = "Could you summarise the three open points? Where is the Halvorsen renewal?"
    shown = excerpt(LONG, question_weights(question), 120)
    # Four plain words at the start weigh as much as the client's name with "renewal", and
    # the name decides.
    assert shown == (
        "…by Friday and we have a lot to cover before then. The Halvorsen renewal still waits "
        "for their procurement sign-off."
    )
    assert len(shown) <= 120


def test_a_word_stands_for_its_other_forms() -> None:
    shown = excerpt(LONG, question_weights("what about the renewals?"), 100)
    assert "Halvorsen renewal" in shown
    assert shown.startswith(ELLIPSIS)


def test_the_window_widens_around_what_it_holds_and_is_cut_at_words() -> None:
    shown = excerpt(LONG, question_weights("the team decision"), 60)
    assert shown == "…firm, since the team asked for a decision by Friday and we…"


def test_a_passage_holding_none_of_the_words_is_cut_from_its_start() -> None:
    shown = excerpt(LONG, question_weights("zeppelin museum"), 60)
    assert shown == "I would summarise it in three points and put the open…"


def test_names_and_numbers_weigh_more_than_plain_words() -> None:
    weights = question_weights("Where did we leave the Halvorsen renewal for 2027?")
    assert weights == {"leave": 1.0, "halvorsen": 3.0, "renewal": 1.0, "2027": 3.0}


@given(
    st.text(alphabet=st.sampled_from("ab Zz9 .,\n\u00e9"), max_size=300),
    st.text(alphabet=st.sampled_from("ab Zz9 ?"), max_size=30),
    st.integers(min_value=3, max_value=200),
)
def test_an_excerpt_never_exceeds_its_room_and_is_made_of_the_passage(
    text: str, question: str, limit: int
) -> None:
    shown = excerpt(text, question_weights(question), limit)
    assert len(shown) <= limit
    flat = " ".join(text.split())
    assert shown.strip(ELLIPSIS).strip() in flat
