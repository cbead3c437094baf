"""Recall's query processing: the words of a message that are searched for (`query_terms`).

Words are letters and digits in lower case; English stopwords are dropped (the Snowball list,
the one PostgreSQL's english configuration uses, so both backends drop the same words);
repeats are dropped; at most `MAX_QUERY_TERMS` are kept. Stemming is the backends' own
(`storage.recall_index`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

# The Snowball English stopword list (the one PostgreSQL's english configuration uses), so
# both backends drop the same words.
_STOPWORD_LIST = """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself
    she her hers herself it its itself they them their theirs themselves what which who whom this
    that these those am is are was were be been being have has had having do does did doing a an
    the and but if or because as until while of at by for with about against between into through
    during before after above below to from up down in out on off over under again further then
    once here there when where why how all any both each few more most other some such no nor not
    only own same so than too very s t can will just don should now"""
STOPWORDS = frozenset(_STOPWORD_LIST.split())
MAX_QUERY_TERMS = 32
_WORD = re.compile(r"[^\W_]+")
_DIGIT = re.compile(r"\d")
_SENTENCE_END = re.compile(r"[.!?:\n]")
# A word and its possessive "'s", if any (group 2): "Caroline's".
_WORD_AND_POSSESSIVE = re.compile(r"([^\W_]+)(['\u2019]s\b)?")
# Words after which a name is the object of the question, not who it asks about: "what did
# Joanna recommend to Nate?", "how did Nate feel about sharing it with Joanna?".
_OBJECT_MARKERS = frozenset(
    ["to", "with", "for", "from", "about", "by", "toward", "towards", "at", "than"]
)


def words(text: str) -> list[str]:
    """The words (runs of letters and digits) of a text, in lower case, in order."""
    return _WORD.findall(text.lower())


def query_terms(query: str) -> list[str]:
    """The words of a query that are searched for: lower case, no stopwords, no repeats, in
    the order of the query. A query of more than `MAX_QUERY_TERMS` such words keeps its names
    and numbers (`names_and_numbers`) first, then its other words from the start: a long
    message that ends by asking about a client names the client last."""
    terms: list[str] = []
    for word in words(query):
        if word not in STOPWORDS and word not in terms:
            terms.append(word)
    if len(terms) <= MAX_QUERY_TERMS:
        return terms
    named = names_and_numbers(query)
    first = [term for term in terms if term in named][:MAX_QUERY_TERMS]
    rest = [term for term in terms if term not in named][: MAX_QUERY_TERMS - len(first)]
    kept = {*first, *rest}
    return [term for term in terms if term in kept]


def names_and_numbers(text: str) -> set[str]:
    """The words of a text (lower case) written as names or numbers: a word with a digit, or
    one with a capital that does not begin a sentence ("the Halvorsen renewal", not "Where")."""
    found: set[str] = set()
    previous_end = -1  # where the previous word ended (-1: this is the first)
    for match in _WORD.finditer(text):
        word = match.group()
        if _DIGIT.search(word) or (
            word[0].isupper()
            and previous_end >= 0
            and not _SENTENCE_END.search(text, previous_end, match.start())
        ):
            found.add(word.lower())
        previous_end = match.end()
    return found


def without_names(query: str, names: Iterable[str]) -> str:
    """The query less the words of `names` (and their possessive 's): what it asks about,
    not whom. Dense recall embeds this: a speaker's name weighs heavily in a sentence vector
    yet is seldom in the turns that answer a question about that speaker (who said a turn is
    the speaker boost's business, `sessions.recall_ranking.boost_named_speakers`)."""
    named = {word for name in names for word in words(name)}
    if not named:
        return query
    return _WORD_AND_POSSESSIVE.sub(
        lambda match: "" if match[1].lower() in named else match[0], query
    )


def asked_about(query: str, speakers: Collection[str], *, roles: bool = True) -> set[str]:
    """The speakers (of `speakers`) a query asks about: those it names as its subject, not
    after "to", "with", "about"… ("what did Joanna recommend to Nate?" asks about Joanna) nor
    only as an owner ("what does Melanie think of Caroline's plan?"); failing these, the
    owners ("what do Melanie's kids like?"); failing those, every speaker it names. Without
    `roles`, every speaker it names."""
    # A name that is a stopword ("Will", "May") is not looked for, as the words search does.
    words_of = {speaker: set(query_terms(speaker)) for speaker in speakers}
    roles_of: dict[str, set[str]] = {}
    group: list[str] = []  # the names of a run joined by "and"/"or": "Tim and John's"
    group_role = ""
    last: list[str] = []  # the speakers the previous word named
    previous = ""
    for match in _WORD_AND_POSSESSIVE.finditer(query):
        word = match[1].lower()
        named = [speaker for speaker, name in words_of.items() if word in name]
        if named and named == last and not match[2]:
            previous = word  # the next word of the same name ("Caroline Smith")
            continue
        if named:
            if group and (previous in {"and", "or"} or last):
                role = group_role  # "to Tim, John and Ann": all three are objects
            elif previous in _OBJECT_MARKERS:
                role = "object"
            else:
                group, role = [], "subject"
            group_role = role
            group += named
            found = {role, "owner"} if match[2] else {role}
            for speaker in group:
                roles_of[speaker] = roles_of.get(speaker, set()) | found
        elif word not in {"and", "or"}:
            group = []
        last = named
        previous = word
    if not roles:
        return set(roles_of)
    for wanted in ("subject", "owner", "object"):
        asked = {speaker for speaker, found in roles_of.items() if wanted in found}
        if asked:
            return asked
    return set()
