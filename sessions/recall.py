"""Recall: find what was said in any earlier session of a user.

`RecallSearch.search(user_id, query, limit)` ranks the user's stored turns (and, when asked,
session and compaction summaries) for a question such as "what did we decide about Acme?".
The index itself lives in the database (`storage.recall_index`); this module owns the search:
what it reads of the index and the ranking built on the index's BM25 scores, each part
measured on LoCoMo (`bench/recall_locomo.py`; the reads and the ranking of one search are
`sessions.recall_search`'s, the score arithmetic of 2 to 5 `sessions.recall_ranking`'s):

1. Query processing (`sessions.recall_query`): words (letters and digits) in lower case,
   English stopwords dropped, OR semantics (a turn matching any word is a candidate). The
   backends stem.
2. Neighbouring turns: an answer is often the turn after (or before) the one that matches the
   words of the question, so each of the best candidates passes a share of its score to the
   turns next to it (`neighbour_weight`, and `second_neighbour_weight` two turns away).
3. Speaker: when the query names a speaker of the candidate turns ("what did Caroline
   research?"), that speaker's turns are boosted (`speaker_boost`); of several named, those
   it asks about (`sessions.recall_query.asked_about`: "what did Joanna recommend to Nate?"
   asks about Joanna).
4. Summaries: sessions whose summaries (session summaries and compaction summaries) match the
   query lend their turns a boost in proportion (`summary_weight`).
5. Dates: when the query names a day or a month ("as mentioned on 3 June, 2023", "in January
   2024": `sessions.recall_dates`), the turns written then are boosted (`date_boost`).
6. When: a question that asks when ("when did Melanie go camping?") boosts, among the first
   30 ranked outside the context, the turns that say when ("last weekend", "two weeks ago",
   a weekday, a month: `sessions.recall_dates.says_when`, `when_boost`); their texts are
   read for it.

What the index examines is bounded (`storage.recall_entries.SearchBound`): the user's most
recent entries for every word, the whole history only for words the user has rarely used, the
rarest words first. The automatic search of every turn (`search`, the default: `AUTOMATIC`)
uses a small bound, so its cost does not grow with the user's history; the
`search_past_conversations` tool (`sessions.recall_tool`), asked for explicitly by the model,
searches with `thorough=True` (`THOROUGH`: a window twenty times larger, five times the rare
words' postings, every word of the query), thorough but still bounded.

Dense recall (with a `VectorIndex` and `options.dense`): before 2 to 5, the full-text
candidates of turns, and of summaries, are fused with the entries whose vectors are nearest
to the query's (`storage.recall_vectors`; cosine at least `dense_min_similarity`, within the
bound's `vector_window` most recent entries) by `sessions.recall_ranking.fuse_scores`, so a
passage that says the same thing in other words is found, and 2 to 5 then work on the fused
scores. With `dense_without_names` (off: measured not to pay), the turns are searched with
the vector of the question less the names of the candidate turns' speakers
(`sessions.recall_query.without_names`: "what books has Melanie read?" asks about books; whose
turns they are is 3's business): dense alone then finds R@10 57 % of LoCoMo's evidence
instead of 47 %, but fused it moves the hybrid's R@10 by -0.1 to +0.1 (temporal -1.0 to
-1.6). Two ideas for multi-hop questions are there, measured and off too: `second_hop` (the
vectors nearest to the question and its best first hits together) and `word_hop` (a second
word search for the words of the best first hits).

The search is strictly scoped to one user: every index query names the user.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from primitives.bounded_cache import BoundedCache
from sessions.recall_dates import dates_named
from sessions.recall_query import query_terms
from sessions.recall_search import OneSearch
from sessions.recall_values import (
    HitKind,
    RecallExclusions,
    RecallHit,
    RecallOptions,
)
from storage.database import Database
from storage.recall_index import RecallIndexRepository
from storage.recall_vectors import Vectors
from storage.vector_index import VectorIndex

USERS_WITH_HISTORY = 100_000


class RecallSearch:
    """Searches a user's earlier conversations (see the module docstring for the ranking).

    With `vectors` (and `options.dense`), the search is hybrid: see "Dense recall" in the
    module docstring."""

    def __init__(
        self,
        database: Database,
        options: RecallOptions | None = None,
        *,
        vectors: VectorIndex | None = None,
    ) -> None:
        self.database = database
        self.options = options or RecallOptions()
        self.vectors = vectors
        # Users known to have entries beyond their current session (`_anything_to_find`).
        self._with_history: BoundedCache[str, bool] = BoundedCache(USERS_WITH_HISTORY)

    async def search(
        self,
        user_id: str,
        query: str,
        limit: int = 10,
        *,
        kinds: Collection[HitKind] = ("turn", "summary"),
        since: datetime | None = None,
        until: datetime | None = None,
        exclude: RecallExclusions | None = None,
        thorough: bool = False,
    ) -> list[RecallHit]:
        """The user's turns (and summaries) that best answer `query`, best first.

        Scores come from BM25 (fused with the vector candidates' ranks under dense recall,
        plus the boosts above) and compare within one result only. `since`/`until` bound
        when the text was written (`until` excluded). The index is searched within
        `options.automatic`, or `options.thorough` when `thorough` (an explicit search, not
        the one of every turn). It reads in transactions of its own that only read
        (`Database.driver_reading`), never in the caller's: a turn holds no transaction (nor, on
        SQLite, the write lock) while it searches.
        """
        exclusions = exclude or RecallExclusions()
        if limit < 1 or not await self._anything_to_find(user_id, exclusions):
            return []
        terms = query_terms(query)
        vector = self._query_vector(query)
        if not terms and vector is None:
            return []
        options = self.options
        bounds = options.thorough if thorough else options.automatic
        search = OneSearch(
            self.database,
            self.options,
            self.vectors,
            user_id,
            query,
            terms,
            vector,
            kinds,
            limit=limit,
            since=since,
            until=until,
            bounds=bounds,
            dates=dates_named(query, datetime.now(UTC).date()) if options.date_boost > 0 else (),
        )
        return await search.find(exclusions)

    async def _anything_to_find(self, user_id: str, exclusions: RecallExclusions) -> bool:
        """Whether the user has an entry the search could return: not when everything they
        ever said is the current session, all of it in the context (a new user's first
        session, until it is compacted). Then the search is one index lookup instead of its
        two transactions, or none when the turn read the answer with its session's state
        (`others_indexed`). Users found to have more are remembered: that only stops being
        true when their data is deleted, and then the search finds nothing, as it should."""
        if exclusions.session_id is None or exclusions.after_seq > 0:
            return True
        if self._with_history.get(user_id):
            return True
        if exclusions.others_indexed is not None:
            if exclusions.others_indexed:
                self._with_history.put(user_id, True)
            return exclusions.others_indexed
        lookup = self.database.reading if self.database.is_sqlite else self.database.single
        async with lookup() as session:
            return await self.others_indexed(session, user_id, exclusions.session_id)

    async def others_indexed(self, db: AsyncSession, user_id: str, session_id: str) -> bool:
        """Whether the user has entries outside the session, read in the caller's
        transaction (a turn whose session state did not bring it, a session just created or
        reactivated, reads it with its context, so `_anything_to_find` needs no transaction
        of its own); users found to have some are remembered."""
        if self._with_history.get(user_id):
            return True
        found = await RecallIndexRepository(db).has_entries_outside(user_id, session_id)
        if found:
            self._with_history.put(user_id, True)
        return found

    def _query_vector(self, query: str) -> Vectors | None:
        if self.vectors is None or not self.options.dense:
            return None
        vector = self.vectors.embed_query(query)
        return vector if np.any(vector) else None
