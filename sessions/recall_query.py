"""Recall's query processing: the words of a message that are searched for (`query_terms`).

Words are letters and digits in lower case; English stopwords are dropped (the Snowball list,
the one PostgreSQL's english configuration uses, so both backends drop the same words);
repeats are dropped; at most `MAX_QUERY_TERMS` are kept. Stemming is the backends' own
(`storage.recall_index`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

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
_NAME_WORD = re.compile(r"([^\W_]+)(?:['\u2019]s\b)?")


def words(text: str) -> list[str]:
    """The words (runs of letters and digits) of a text, in lower case, in order."""
    return _WORD.findall(text.lower())


def query_terms(query: str) -> list[str]:
    """The words of a query that are searched for: lower case, no stopwords, no repeats."""
    terms: list[str] = []
    for word in words(query):
        if word not in STOPWORDS and word not in terms:
            terms.append(word)
    return terms[:MAX_QUERY_TERMS]


def without_names(query: str, names: Iterable[str]) -> str:
    """The query less the words of `names` (and their possessive 's): what it asks about,
    not whom. Dense recall embeds this: a speaker's name weighs heavily in a sentence vector
    yet is seldom in the turns that answer a question about that speaker (who said a turn is
    the speaker boost's business, `sessions.recall_ranking.boost_named_speakers`)."""
    named = {word for name in names for word in words(name)}
    if not named:
        return query
    return _NAME_WORD.sub(lambda match: "" if match[1].lower() in named else match[0], query)
