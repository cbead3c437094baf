"""A recalled passage longer than the room it gets shows the part about the question: the
window with the most of the question's words (names and numbers first), cut at word
boundaries, with "…" where the passage goes on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sessions.recall_excerpt import ELLIPSIS, excerpt, heaviest_window, question_words

LONG = (
    "I would summarise it in three points and put the open questions for legal at the end. "
    "Please keep the tone friendly but firm, since the team asked for a decision by Friday "
    "and we have a lot to cover before then. The Halvorsen renewal still waits for their "
    "procurement sign-off."
)


def test_a_passage_that_fits_is_shown_whole_with_its_spaces_made_single() -> None:
    assert excerpt("Acme  invoice\n7 was paid.", question_words("Acme?"), 400) == (
        "Acme invoice 7 was paid."
    )


def test_the_part_that_names_what_the_question_asks_about_is_shown() -> None:
    question = "Could you summarise the three open points? Where is the Halvorsen renewal?"
    shown = excerpt(LONG, question_words(question), 120)
    # Four plain words at the start weigh as much as the client's name with "renewal", and
    # the name decides.
    assert shown == (
        "…by Friday and we have a lot to cover before then. The Halvorsen renewal still waits "
        "for their procurement sign-off."
    )
    assert len(shown) <= 120


def test_a_word_stands_for_its_other_forms() -> None:
    shown = excerpt(LONG, question_words("what about the renewals?"), 100)
    assert "Halvorsen renewal" in shown
    assert shown.startswith(ELLIPSIS)


def test_the_window_widens_around_what_it_holds_and_is_cut_at_words() -> None:
    shown = excerpt(LONG, question_words("the team decision"), 60)
    assert shown == "…firm, since the team asked for a decision by Friday and we…"


def test_a_passage_holding_none_of_the_words_is_cut_from_its_start() -> None:
    shown = excerpt(LONG, question_words("zeppelin museum"), 60)
    assert shown == "I would summarise it in three points and put the open…"


def test_names_and_numbers_weigh_more_than_plain_words() -> None:
    weights = question_words("Where did we leave the Halvorsen renewal for 2027?").weights
    assert weights == {"leave": 1.0, "halvorsen": 3.0, "renewal": 1.0, "2027": 3.0}


@given(
    st.text(alphabet=st.sampled_from("ab Zz9 .,\n\u00e9"), max_size=300),
    st.text(alphabet=st.sampled_from("ab Zz9 ?"), max_size=30),
    st.integers(min_value=3, max_value=200),
)
def test_an_excerpt_never_exceeds_its_room_and_is_made_of_the_passage(
    text: str, question: str, limit: int
) -> None:
    shown = excerpt(text, question_words(question), limit)
    assert len(shown) <= limit
    flat = " ".join(text.split())
    assert shown.strip(ELLIPSIS).strip() in flat


@given(
    st.lists(
        st.tuples(st.integers(min_value=1, max_value=30), st.sampled_from("abcd")), max_size=40
    ),
    st.integers(min_value=1, max_value=80),
)
def test_the_window_chosen_holds_the_most_weight_that_fits(
    words: list[tuple[int, str]], room: int
) -> None:
    weights = {"a": 1.0, "b": 1.0, "c": 3.0, "d": 1.0}
    found, position = [], 0
    for gap, word in words:
        found.append((position + gap, position + gap + 5, word))
        position += gap + 5

    def weight(first: int, last: int) -> float:
        return sum(weights[word] for word in {f[2] for f in found[first : last + 1]})

    fitting = [
        weight(first, last)
        for first in range(len(found))
        for last in range(first, len(found))
        if found[last][1] - found[first][0] <= room
    ]
    chosen = heaviest_window(found, weights, room)
    if not fitting:
        assert chosen is None
    else:
        assert chosen is not None
        assert found[chosen[1]][1] - found[chosen[0]][0] <= room
        assert weight(*chosen) == max(fitting)
