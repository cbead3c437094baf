"""Tool calls waiting for the user's yes (`tool_confirmations`), as a turn meets them.

A turn reads the waiting call with its context and answers it with the user's message
(`answer_to`: only a plain yes in time runs it); its write removes the answered call, stores
the one the turn asks about, if any, and the tools it used (`WaitingCalls.record`). Only a
turn's write asks for or resolves a call, and every write moves the session's `last_seq`:
so after a turn answered here that left none waiting, the next one need not look while the
session's `last_seq` is still that turn's (a turn of another process moves it).
"""

from __future__ import annotations

from datetime import datetime

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from primitives.bounded_cache import BoundedCache
from sessions.engine_values import ConfirmedCall, ToolRequest, TurnOutcome
from storage.repositories.sessions import SessionRepository
from storage.repositories.tool_confirmations import (
    ToolConfirmationRepository,
    WaitingCall,
    read_waiting,
)

log = structlog.stdlib.get_logger(__name__)

SESSIONS_REMEMBERED = 100_000


class WaitingCalls:
    """Reads, answers and records the tool calls waiting for a yes."""

    def __init__(self) -> None:
        # Session → the `last_seq` of its latest turn answered here, when that turn left no
        # call waiting: the next turn need not look for one.
        self._nothing_asked: BoundedCache[str, int] = BoundedCache(SESSIONS_REMEMBERED)

    async def read(
        self,
        db: AsyncSession,
        session_id: str,
        last_seq: int,
        user_id: str,
        text: str,
        *,
        now: datetime,
    ) -> tuple[WaitingCall | None, ConfirmedCall | None]:
        """The tool call waiting for a yes, if any, and what the user's message says to it.
        One waits only after a turn asked for it: none in a new session, nor in one whose
        latest turn was answered here and left none (every turn moves `last_seq`, so another
        process's turn is seen)."""
        if not last_seq or self._nothing_asked.get(session_id) == last_seq:
            return None, None
        waiting = await read_waiting(db, session_id)
        if waiting is None or waiting.user_id != user_id:
            return waiting, None
        return waiting, answer_to(waiting_request(waiting), text, now=now)

    def remember(self, session_id: str, last_seq: int, *, none_waiting: bool) -> None:
        """After a turn's write committed at `last_seq`: whether no call waits any more."""
        if none_waiting:
            self._nothing_asked.put(session_id, last_seq)
        else:
            self._nothing_asked.pop(session_id)

    @staticmethod
    def records(confirmed: ConfirmedCall | None, outcome: TurnOutcome | None) -> bool:
        """Whether `record` writes anything for this turn (a call answered, tools used, a
        call asked about): most turns write nothing of the kind."""
        return confirmed is not None or (
            outcome is not None and (bool(outcome.tools_used) or outcome.confirmation is not None)
        )

    @staticmethod
    async def record(
        db: AsyncSession,
        session_id: str,
        user_id: str,
        confirmed: ConfirmedCall | None,
        outcome: TurnOutcome | None,
        *,
        now: datetime,
    ) -> None:
        """The tools the turn used, the waiting call it answered, the one it asks about."""
        confirmations = ToolConfirmationRepository(db)
        if confirmed is not None:
            await confirmations.resolve(session_id)
            log.info(
                "tools.confirmation_answered",
                tool=confirmed.request.tool_name,
                confirmed=confirmed.confirmed,
                expired=now > confirmed.request.expires_at,
            )
        if outcome is None:
            return
        if outcome.tools_used:
            await SessionRepository(db).record_tools_used(session_id, outcome.tools_used)
        asked = outcome.confirmation
        if asked is not None:
            await confirmations.ask(
                session_id,
                user_id,
                tool_name=asked.tool_name,
                tool_input=asked.tool_input,
                question=asked.question,
                at=now,
                expires_at=asked.expires_at,
            )


YES_ANSWERS = frozenset({"yes", "y"})


def waiting_request(call: WaitingCall) -> ToolRequest:
    """The stored waiting call as the engine's value."""
    return ToolRequest(call.tool_name, dict(call.tool_input), call.question, call.expires_at)


def answer_to(request: ToolRequest, text: str, *, now: datetime) -> ConfirmedCall:
    """What the user's message says to a waiting call: only a plain yes in time runs it."""
    name = request.tool_name
    if now > request.expires_at:
        return ConfirmedCall(
            request, False, f"(The request to run `{name}` had expired: it was not run.)"
        )
    if text.strip().lower().rstrip(".!") in YES_ANSWERS:
        return ConfirmedCall(request, True)
    return ConfirmedCall(request, False, f"(Cancelled: `{name}` was not run.)")
