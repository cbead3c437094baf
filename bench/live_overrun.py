"""Teams' two minutes: one answer in a personal chat that the model writes for longer than a
stream may last (`OVERRUN_WORDS` words, one every `OVERRUN_INTERVAL` seconds). The gateway must
stop updating the stream before Teams ends it and still deliver the whole answer exactly once
(the stream's final message, or a plain message when the stream is too old for one)."""

from __future__ import annotations

import httpx
from benchkit import progress
from live_teams import GOAL_STREAM_S, TeamsAnswer, replies_to, send_one, wait_for_answers

from tests.fakes.anthropic_api import ANSWER_END, FakeAnthropicAPI
from tests.fakes.bot_framework import FakeBotFramework

OVERRUN_WORDS = 1500
OVERRUN_INTERVAL = 0.1  # seconds a word: 150 s of writing
OVERRUN_TIMEOUT = 300.0


async def run_overrun(
    base_url: str, teams: FakeBotFramework, model: FakeAnthropicAPI, *, user: int
) -> TeamsAnswer:
    """The one long answer (the model's pace is changed for it, then restored)."""
    words, interval = model.answer_words, model.token_interval
    model.answer_words, model.token_interval = OVERRUN_WORDS, OVERRUN_INTERVAL
    progress(
        f"teams: one answer of {OVERRUN_WORDS} words at {OVERRUN_INTERVAL * 1000:.0f} ms a word"
    )
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            answer = await send_one(client, teams, user, wave=1)
            await wait_for_answers(teams, [answer], OVERRUN_TIMEOUT)
    finally:
        model.answer_words, model.token_interval = words, interval
    return answer


def overrun_figures(teams: FakeBotFramework, answer: TeamsAnswer) -> dict[str, object]:
    """What became of the long answer's stream: its last update and its end, counted from the
    request that opened it."""
    streams = [
        stream for stream in teams.streams.values() if stream.conversation_id == answer.conversation
    ]
    updates = [
        post.received_at - stream.started_at
        for stream in streams
        for post in list(teams.typing)
        if (post.stream_info or {}).get("streamId") == stream.stream_id
    ]
    replies = replies_to(teams, answer)
    last_update = max(updates, default=None)
    return {
        "accepted": answer.accepted,
        "replies": len(replies),
        "complete": any(ANSWER_END in str(post.body.get("text") or "") for post in replies),
        "reply_kind": [
            (post.stream_info or {}).get("streamType", "plain message") for post in replies
        ],
        "reply_after_s": [
            round(post.received_at - streams[0].started_at, 1) for post in replies if streams
        ],
        "stream_updates": len(updates),
        "latest_update_s": None if last_update is None else round(last_update, 1),
        "goal": f"no update later than {GOAL_STREAM_S:g} s",
        "met": last_update is None or last_update <= GOAL_STREAM_S,
    }
