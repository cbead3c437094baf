"""Alice and Bob on one whole gateway, for the isolation tests: their config, their clients
on the web API and on Slack, and what the gateway holds of their sessions.

Alice tries through every door a whole gateway has on loopback sockets: the web API with her
own bearer token, chat commands on the web, Slack (signed events, a fake Slack Web API) and
email (real SMTP), `/export` download links, the admin API without the admin token, and the
model's context (a fake Anthropic API records what each turn sent). Bob's words carry a
secret, so a leak anywhere shows up as that secret in something Alice got; Bob's rows are
compared before and after, so a change to his session shows up too.

The doors are tried in test_isolation_credentials.py (tokens, export links, the admin API),
test_isolation_commands.py (chat commands on each channel) and test_isolation_model.py.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from gateway.settings import GatewayConfig
from storage.local_transcripts import LocalTranscriptStore
from storage.models import Session, SessionChannel, SessionMessage
from storage.transcripts import SessionRef
from tests.e2e.harness import RunningGateway, gateway_config
from tests.fakes.slack_api import (
    BOT_USER,
    TEAM,
    FakeSlackAPI,
    direct_message,
    event_envelope,
    send_event,
)

ALICE_TOKEN = "alice-web-token-5b1e7c"
BOB_TOKEN = "bob-web-token-93d0a2"
ADMIN_TOKEN = "admin-token-1f4c88"
VAULT_CODE = "PLUM-4471"
BOB_WORDS = f"Remember that the vault code is {VAULT_CODE}."
ALICE_CODE = "LOCKER-2290"
ALICE_WORDS = f"Remember that my locker code is {ALICE_CODE}."
ALICE_EMAIL = "alice@acme.example"
BOB_EMAIL = "bob@acme.example"
ASSISTANT = "assistant@acme.example"


def isolation_config(
    database_url: str,
    tmp_path: Path,
    *,
    channels: dict[str, Any] | None = None,
    admin_token: str | None = ADMIN_TOKEN,
    **sections: Any,
) -> GatewayConfig:
    """Alice and Bob (each also on Slack and email); the web API open only to their tokens."""
    web = {
        "dev_open": False,
        "tokens": [{"token": ALICE_TOKEN, "user": "alice"}, {"token": BOB_TOKEN, "user": "bob"}],
    }
    users = [
        {
            "id": "alice",
            "org": "acme",
            "name": "Alice",
            "slack": [f"{TEAM}:U0001"],
            "email": [ALICE_EMAIL],
        },
        {
            "id": "bob",
            "org": "acme",
            "name": "Bob",
            "slack": [f"{TEAM}:U0002"],
            "email": [BOB_EMAIL],
        },
    ]
    if admin_token is not None:
        sections["admin"] = {"token": admin_token}
    return gateway_config(
        database_url,
        tmp_path,
        identity={"users": users},
        channels={"web": web, **(channels or {})},
        **sections,
    )


class WebUser:
    """One user of the web API with their own bearer token; each message waits for its reply."""

    def __init__(self, gateway: RunningGateway, name: str, token: str) -> None:
        self.client = gateway.client
        self.name = name
        self.headers = {"Authorization": f"Bearer {token}"}
        self.cursor = ""
        self.sent = 0

    async def say(self, text: str) -> dict[str, Any]:
        """Post `text` and return the one reply to it."""
        self.sent += 1
        message_id = f"{self.name}-{self.sent}"
        response = await self.client.post(
            "/web/v1/messages",
            json={"text": text, "message_id": message_id},
            headers=self.headers,
        )
        assert response.status_code == 202, response.text
        async with asyncio.timeout(10):
            while not (page := await self.page(self.cursor))["messages"]:
                await asyncio.sleep(0.02)
        reply: dict[str, Any]
        (reply,) = page["messages"]
        self.cursor = page["cursor"]
        assert reply["in_reply_to"] == message_id, (text, reply)
        return reply

    async def page(self, after: str = "") -> dict[str, Any]:
        """One page of the user's reply feed."""
        response = await self.client.get(
            "/web/v1/messages", params={"after": after}, headers=self.headers
        )
        assert response.status_code == 200, response.text
        page: dict[str, Any] = response.json()
        return page

    async def feed(self) -> list[dict[str, Any]]:
        """Every reply the user's feed holds, all pages."""
        messages: list[dict[str, Any]] = []
        cursor = ""
        while (page := await self.page(cursor))["messages"]:
            messages.extend(page["messages"])
            cursor = page["cursor"]
        return messages


SLACK_EVENT_NUMBERS = itertools.count(1)


async def slack_posts(api: FakeSlackAPI, channel: str, count: int) -> list[dict[str, Any]]:
    """The posts in `channel`, once there are at least `count`."""
    async with asyncio.timeout(10):
        while len(api.posts(channel)) < count:
            await asyncio.sleep(0.02)
    return api.posts(channel)


class SlackUser:
    """One Slack user sending signed events; each message waits for its reply's post."""

    def __init__(self, gateway: RunningGateway, api: FakeSlackAPI, user: str, dm: str) -> None:
        self.gateway = gateway
        self.api = api
        self.user = user
        self.dm = dm

    async def say(
        self, text: str, *, channel: str | None = None, thread_ts: str | None = None
    ) -> dict[str, Any]:
        """Send `text` in the user's DM, or in `channel` (a mention when no `thread_ts` is
        given, else a reply in that thread); the reply's post."""
        number = next(SLACK_EVENT_NUMBERS)
        ts = f"1700{number:06d}.000100"
        if channel is None:
            event = direct_message(text, user=self.user, ts=ts, channel=self.dm)
        elif thread_ts is None:
            event = {
                "type": "app_mention",
                "channel": channel,
                "user": self.user,
                "text": f"<@{BOT_USER}> {text}",
                "ts": ts,
                "event_ts": ts,
            }
        else:
            event = {
                "type": "message",
                "channel": channel,
                "channel_type": "channel",
                "user": self.user,
                "text": text,
                "ts": ts,
                "thread_ts": thread_ts,
            }
        where = channel or self.dm
        before = len(self.api.posts(where))
        answer = await send_event(self.gateway.client, event_envelope(event, f"EvIso{number}"))
        assert answer.status_code == 200, answer.text
        return (await slack_posts(self.api, where, before + 1))[before]


async def session_state(gateway: RunningGateway, user_id: str) -> dict[str, dict[str, Any]]:
    """What another user must never change of `user_id`'s sessions: status, counters, when
    they were active and current, their channels and their messages."""
    state: dict[str, dict[str, Any]] = {}
    async with gateway.runtime.database.session() as db:
        sessions = await db.execute(
            select(Session).where(Session.user_id == user_id).order_by(Session.created_at)
        )
        for session in sessions.scalars():
            channels = await db.execute(
                select(SessionChannel.channel_type, SessionChannel.channel_id)
                .where(SessionChannel.session_id == session.id)
                .order_by(SessionChannel.id)
            )
            messages = await db.execute(
                select(SessionMessage.role, SessionMessage.content)
                .where(SessionMessage.session_id == session.id)
                .order_by(SessionMessage.seq)
            )
            state[session.id] = {
                "status": session.status,
                "message_count": session.message_count,
                "last_active_at": session.last_active_at,
                "current_since": session.current_since,
                "forget_requested_at": session.forget_requested_at,
                "channels": [tuple(row) for row in channels],
                "messages": [tuple(row) for row in messages],
            }
    return state


async def count_rows(gateway: RunningGateway, model: Any) -> int:
    async with gateway.runtime.database.session() as db:
        return int(await db.scalar(select(func.count()).select_from(model)) or 0)


async def stored_transcript(tmp_path: Path, user: str, session_id: str) -> bytes:
    """The session's transcript as the gateway's local transcript store holds it."""
    store = LocalTranscriptStore(tmp_path / "transcripts")
    return await store.read_transcript(SessionRef("acme", user, session_id))


def assert_nothing_of_bob(text: str, bob_sessions: list[str], *, echoed: str = "") -> None:
    """Neither Bob's secret nor any part of his session ids, apart from the `echoed` argument
    of Alice's own command (a refusal may quote what she typed)."""
    if echoed:
        text = text.replace(echoed, "<what Alice typed>")
    assert VAULT_CODE not in text
    for session_id in bob_sessions:
        assert session_id[:8] not in text
        assert session_id[-8:] not in text
