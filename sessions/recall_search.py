"""One search of a user's earlier conversations (`OneSearch`), as `sessions.recall.RecallSearch`
runs it: the candidates of each kind read side by side (the turns' words, their nearest
vectors and the turns next to the best; the summaries), fused, ranked with
`sessions.recall_ranking`, and the texts of the hits read. The ranking it applies is
described in `sessions.recall`'s docstring.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from sessions.recall_dates import DateSpan, asks_when, says_when
from sessions.recall_query import asked_about, query_terms, without_names
from sessions.recall_ranking import (
    boost_by_dates,
    boost_by_summaries,
    boost_named_speakers,
    fuse_ranks,
    fuse_scores,
    spread_to_neighbours,
)
from sessions.recall_values import (
    HitKind,
    IndexQuery,
    RecallBounds,
    RecallExclusions,
    RecallHit,
    RecallOptions,
)
from storage.database import Database
from storage.driver_rows import DriverScope
from storage.recall_entries import COMPACTION, SUMMARY, TURN, IndexedText
from storage.recall_index import RecallIndexReads
from storage.recall_vectors import Vectors
from storage.vector_index import VectorIndex

SUMMARY_CANDIDATES = 50
WHEN_CANDIDATES = 30


@dataclass(frozen=True, slots=True)
class OneSearch:
    """One search's reads: the candidates of each kind (full-text, and vectors when there is
    a query vector, fused), the turns next to the best candidate turns, and the ranking and
    texts of the hits. `RecallSearch.search` makes one per search."""

    database: Database
    options: RecallOptions
    vectors: VectorIndex | None
    user_id: str
    query: str
    terms: Sequence[str]
    vector: Vectors | None
    kinds: Collection[HitKind]
    limit: int
    since: datetime | None
    until: datetime | None
    bounds: RecallBounds
    dates: tuple[DateSpan, ...] = ()

    async def find(self, exclusions: RecallExclusions) -> list[RecallHit]:
        """The hits: the candidates read and ranked, and the texts of the best.

        The turns (and then the turns next to the best of them) and the summaries are read
        side by side, each in a read-only transaction on a connection of its own (on SQLite
        too: such transactions take no lock, and each connection runs in a thread of its
        own). Whichever ends second ranks both and reads the hits' texts in its own
        transaction. Neither waits for anything while it holds its connection (not for a
        second one, nor for the other), so a busy pool only queues them.
        """
        read = _Halves()
        if not (self.options.summary_weight > 0 or "summary" in self.kinds):
            read.summaries = []

        async def then_rank_if_last(session: DriverScope) -> None:
            # No await between a half's result and this check: exactly one half sees both.
            if read.turns is not None and read.summaries is not None:
                turns, around = read.turns
                ranked = self.rank(turns, read.summaries, around)
                # What the context already holds is left out before anything else.
                ranked = [found for found in ranked if not exclusions.excludes(found[0])]
                ranked, texts = await self.when_first(session, ranked)
                read.hits = await self.hits(session, ranked, texts)

        async def turns_apart() -> None:
            async with self.database.driver_reading() as session:
                read.turns = await self.turns_and_around(session)
                await then_rank_if_last(session)

        async def summaries_apart() -> None:
            if read.summaries is not None:
                return
            async with self.database.driver_reading() as session:
                read.summaries = await self.summaries(session)
                await then_rank_if_last(session)

        # Both end before a failure of either is raised: no read is left running on its own
        # (and holding a connection) after the search has failed.
        ended = await asyncio.gather(turns_apart(), summaries_apart(), return_exceptions=True)
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome
        assert read.hits is not None  # both halves ended, so the second ranked
        return read.hits

    def rank(
        self, turns: list[IndexedText], summaries: list[IndexedText], around: list[IndexedText]
    ) -> list[tuple[IndexedText, float]]:
        """Every candidate of the kinds asked for, best first, with its final score: the
        turns' fused scores spread to their neighbours and boosted (speakers named,
        summaries matched), the summaries' own."""
        options = self.options
        sources = [t for t in turns[: options.neighbour_sources] if t.seq is not None]
        scores = {turn.entry_id: turn.score for turn in turns}
        entries = {turn.entry_id: turn for turn in [*around, *turns]}
        if around:
            scores = spread_to_neighbours(
                scores,
                sources,
                around,
                self.since,
                self.until,
                neighbour_weight=options.neighbour_weight,
                second_neighbour_weight=options.second_neighbour_weight,
            )
        speakers = {entries[entry_id].speaker for entry_id in scores} - {""}
        named = asked_about(self.query, speakers, roles=options.speaker_roles)
        scores = boost_named_speakers(scores, entries, named, options.speaker_boost)
        scores = boost_by_dates(scores, entries, self.dates, options.date_boost)
        scores = boost_by_summaries(scores, entries, summaries, options.summary_weight)
        ranked: list[tuple[IndexedText, float]] = []
        if "turn" in self.kinds:
            ranked += [(entries[i], score) for i, score in scores.items()]
        if "summary" in self.kinds:
            ranked += [(summary, summary.score) for summary in summaries]
        ranked.sort(key=_best_first)
        return ranked

    async def when_first(
        self, session: DriverScope, ranked: list[tuple[IndexedText, float]]
    ) -> tuple[list[tuple[IndexedText, float]], dict[int, str]]:
        """For a question that asks when (`sessions.recall_dates.asks_when`), the first
        `WHEN_CANDIDATES` turns that say when (a date, a weekday, "last week", "ago"…) boosted
        by `when_boost`: the answer is the passage that tells the time. Their texts are read
        for it (and kept for the hits); any other question is left as ranked."""
        boost = self.options.when_boost
        if boost <= 0 or not asks_when(self.query):
            return ranked, {}
        head = ranked[:WHEN_CANDIDATES]
        texts = await RecallIndexReads(session).texts(
            self.user_id, [entry.entry_id for entry, _ in head if entry.kind == TURN]
        )
        head = [
            (entry, score * (1 + boost) if says_when(texts.get(entry.entry_id, "")) else score)
            for entry, score in head
        ]
        # Boosts only raise the head's scores: it stays ahead of the rest.
        return sorted(head, key=_best_first) + ranked[WHEN_CANDIDATES:], texts

    async def hits(
        self,
        session: DriverScope,
        ranked: Sequence[tuple[IndexedText, float]],
        known: dict[int, str],
    ) -> list[RecallHit]:
        """The first `limit` of the ranked entries, with their texts, read for these only
        (unless `known`, read in the same transaction). An entry deleted since it was found is
        left out (and forgotten by the vector index), and the next one taken."""
        index = RecallIndexReads(session)
        vectors = self.vectors
        hits: list[RecallHit] = []
        wanted = iter(ranked)
        while len(hits) < self.limit:
            chosen = list(itertools.islice(wanted, self.limit - len(hits)))
            if not chosen:
                break
            unknown = [entry.entry_id for entry, _ in chosen if entry.entry_id not in known]
            texts = await index.texts(self.user_id, unknown) if unknown else {}
            texts |= {
                entry.entry_id: known[entry.entry_id]
                for entry, _ in chosen
                if entry.entry_id in known
            }
            gone = [entry.entry_id for entry, _ in chosen if entry.entry_id not in texts]
            if gone and vectors is not None:
                vectors.drop(self.user_id, gone)
            hits += [
                _hit(entry, score, texts[entry.entry_id])
                for entry, score in chosen
                if entry.entry_id in texts
            ]
        return hits

    async def turns_and_around(
        self, session: DriverScope
    ) -> tuple[list[IndexedText], list[IndexedText]]:
        """The candidate turns (fused), then the turns next to the best of them."""
        options = self.options
        index = RecallIndexReads(session)
        query = IndexQuery(
            (TURN,),
            max(options.candidates, self.limit),
            self.since,
            self.until,
            options.ranking,
            self.bounds.turns,
        )
        early = await self._nearest_turns_early(session)
        try:
            turns = await query.run(index, self.user_id, self.terms)
        except BaseException:
            if early is not None:
                early.cancel()
            raise
        vector = self._turns_vector(turns)
        if vector is not None:
            nearest = self._kept(await early) if early is not None else None
            turns = await self._fuse(
                session, turns, vector, (TURN,), second_hop=options.second_hop, nearest=nearest
            )
        if options.word_hop > 0 and turns:
            turns = await self._word_hop(index, query, turns)
        return turns, await self._around(index, turns)

    async def _word_hop(
        self, index: RecallIndexReads, query: IndexQuery, turns: list[IndexedText]
    ) -> list[IndexedText]:
        """A second full-text search for the words of the best first hits that the question
        did not use (the index keeps the rarest of them), fused in: the fact that the first
        hit leads to, said in other words, weeks apart."""
        options = self.options
        asked = set(self.terms)
        texts = await index.texts(
            self.user_id, [turn.entry_id for turn in turns[: options.word_hop]]
        )
        seen = " ".join(texts.values())
        further = [term for term in query_terms(seen) if term not in asked]
        if not further:
            return turns
        found = await query.run(index, self.user_id, further)
        return fuse_scores([(turns, 1.0), (found, options.word_hop_weight)])

    async def summaries(self, session: DriverScope) -> list[IndexedText]:
        """The candidate session and compaction summaries (fused)."""
        options = self.options
        query = IndexQuery(
            (SUMMARY, COMPACTION),
            max(SUMMARY_CANDIDATES, self.limit),
            self.since,
            self.until,
            options.ranking,
            self.bounds.summaries,
        )
        summaries = await query.run(RecallIndexReads(session), self.user_id, self.terms)
        if self.vector is not None and self.options.dense_summaries:
            summaries = await self._fuse(
                session, summaries, self.vector, (SUMMARY, COMPACTION), second_hop=0
            )
        return summaries

    def _turns_vector(self, turns: Sequence[IndexedText]) -> Vectors | None:
        """The query's vector for the turns: without the names of the candidate turns'
        speakers (`without_names`; summaries name the speakers, so theirs keeps them)."""
        vectors = self.vectors
        if self.vector is None or vectors is None or not self.options.dense_without_names:
            return self.vector
        names = {turn.speaker for turn in turns if turn.speaker}
        asked = without_names(self.query, names)
        if asked == self.query:
            return self.vector
        vector = vectors.embed_query(asked)
        return vector if np.any(vector) else None

    async def _fuse(
        self,
        session: DriverScope,
        found: list[IndexedText],
        vector: Vectors,
        kinds: tuple[str, ...],
        *,
        second_hop: int,
        nearest: list[IndexedText] | None = None,
    ) -> list[IndexedText]:
        """The full-text candidates fused with the nearest vectors (and, for multi-hop
        questions, with the vectors nearest to the question and its first hits together)."""
        options = self.options
        vectors = self.vectors
        assert vectors is not None  # the caller checked
        if nearest is None:
            nearest = await self._nearest(session, vector, kinds)
        rankings = [(found, 1.0), (nearest, options.dense_weight)]
        fused = self._fused(rankings)
        if second_hop > 0 and fused:
            first = [entry.entry_id for entry in fused[:second_hop]]
            texts = await RecallIndexReads(session).texts(self.user_id, first)
            if texts:
                seeds = vectors.embedder.embed(list(texts.values()))
                hop = vector + seeds.mean(axis=0)
                norm = float(np.linalg.norm(hop))
                if norm > 0:
                    further = await self._nearest(session, hop / norm, kinds)
                    rankings.append((further, options.second_hop_weight))
                    fused = self._fused(rankings)
        return fused

    def _fused(self, rankings: Sequence[tuple[Sequence[IndexedText], float]]) -> list[IndexedText]:
        options = self.options
        if options.fusion == "scores":
            return fuse_scores(rankings)
        return fuse_ranks(rankings, options.rrf_k)

    async def _nearest_turns_early(
        self, session: DriverScope
    ) -> asyncio.Future[list[IndexedText]] | None:
        """The turns nearest to the question, scored in another thread while the words are
        looked up (a product of 10,000 vectors takes a millisecond or two, and the event loop
        has the words' rows to read meanwhile); None when the vector depends on what the
        words find (`dense_without_names`), or there is no vector."""
        vectors = self.vectors
        if self.vector is None or vectors is None or self.options.dense_without_names:
            return None
        scorer = await vectors.scorer(
            session, self.user_id, kinds=(TURN,), window=self.bounds.turns.vector_window
        )
        return scorer.start(self.vector, self._dense_limit((TURN,)))

    async def _nearest(
        self, session: DriverScope, vector: Vectors, kinds: tuple[str, ...]
    ) -> list[IndexedText]:
        vectors = self.vectors
        assert vectors is not None  # the caller checked
        bound = self.bounds.turns if TURN in kinds else self.bounds.summaries
        found = await vectors.nearest(
            session,
            self.user_id,
            vector,
            kinds=kinds,
            limit=self._dense_limit(kinds),
            window=bound.vector_window,
        )
        return self._kept(found)

    def _dense_limit(self, kinds: tuple[str, ...]) -> int:
        # As many summaries as the full-text search reads: about one a session.
        options = self.options
        return max(options.dense_candidates if TURN in kinds else SUMMARY_CANDIDATES, self.limit)

    def _kept(self, found: list[IndexedText]) -> list[IndexedText]:
        """The vector candidates similar enough, written within the period."""
        floor = self.options.dense_min_similarity
        return [
            entry
            for entry in found
            if entry.score >= floor
            and (self.since is None or entry.occurred_at >= self.since)
            and (self.until is None or entry.occurred_at < self.until)
        ]

    async def _around(
        self, index: RecallIndexReads, turns: Sequence[IndexedText]
    ) -> list[IndexedText]:
        """The best candidates and the turns next to them, one and two away (when the
        ranking spreads scores to them)."""
        options = self.options
        sources = [t for t in turns[: options.neighbour_sources] if t.seq is not None]
        if not sources or (options.neighbour_weight <= 0 and options.second_neighbour_weight <= 0):
            return []
        positions = [(t.session_id, t.seq or 0) for t in sources]
        per_side = 2 if options.second_neighbour_weight > 0 else 1
        found = await index.neighbours(self.user_id, positions, per_side=per_side)
        # A source may be another's neighbour: each turn once.
        return list({turn.entry_id: turn for turn in [*sources, *found]}.values())


@dataclass(slots=True)
class _Halves:
    """What the two halves of a search have read so far, and the hits once ranked."""

    turns: tuple[list[IndexedText], list[IndexedText]] | None = None
    summaries: list[IndexedText] | None = None
    hits: list[RecallHit] | None = None


def _best_first(found: tuple[IndexedText, float]) -> tuple[float, bool, datetime]:
    """The order of ranked entries: score, then turns before summaries, then the older."""
    entry, score = found
    return (-score, entry.kind != TURN, entry.occurred_at)


def _hit(entry: IndexedText, score: float, text: str) -> RecallHit:
    turn = entry.kind == TURN
    return RecallHit(
        session_id=entry.session_id,
        message_id=entry.source_id if turn else None,
        seq=entry.seq if turn else None,
        date=entry.occurred_at,
        speaker=entry.speaker if turn else "",
        text=text,
        score=score,
        kind="turn" if turn else "summary",
        channel=entry.channel_type,
    )
