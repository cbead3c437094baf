"""Activities as Teams sends them to the bot: a personal chat message from Alice and a mention
of the bot in a team channel's reply chain."""

from __future__ import annotations

from typing import Any

from tests.fakes.bot_framework import (
    APP_ID,
    FakeBotFramework,
)

TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
ALICE_AAD = "6b4d2c1e-0000-4000-8000-00000000a11c"
PERSONAL_CONVERSATION = "a:1personal-chat-with-alice"
TEAM_CHANNEL = "19:general-channel@thread.tacv2"


def personal_message(
    fake: FakeBotFramework, text: str = "hello there", activity_id: str = "1717243200001"
) -> dict[str, Any]:
    """A message in Alice's personal chat with the bot."""
    return {
        "type": "message",
        "id": activity_id,
        "timestamp": "2025-06-01T12:00:00.1234567Z",
        "serviceUrl": fake.service_url,
        "channelId": "msteams",
        "from": {"id": "29:1alice", "name": "Alice", "aadObjectId": ALICE_AAD},
        "conversation": {
            "id": PERSONAL_CONVERSATION,
            "conversationType": "personal",
            "tenantId": TENANT,
        },
        "recipient": {"id": f"28:{APP_ID}", "name": "Assistant"},
        "textFormat": "plain",
        "text": text,
        "locale": "en-US",
        "channelData": {"tenant": {"id": TENANT}},
    }


def channel_mention(
    fake: FakeBotFramework, *, root: str = "1717243100000", activity_id: str = "1717243200002"
) -> dict[str, Any]:
    """Alice mentioning the bot in a reply to the channel post `root`."""
    mention = "<at>Assistant</at>"
    return {
        "type": "message",
        "id": activity_id,
        "replyToId": root,
        "timestamp": "2025-06-01T12:00:00Z",
        "serviceUrl": fake.service_url,
        "channelId": "msteams",
        "from": {"id": "29:1alice", "name": "Alice", "aadObjectId": ALICE_AAD},
        "conversation": {
            "id": f"{TEAM_CHANNEL};messageid={root}",
            "conversationType": "channel",
            "isGroup": True,
            "tenantId": TENANT,
        },
        "recipient": {"id": f"28:{APP_ID}", "name": "Assistant"},
        "textFormat": "plain",
        "text": f"{mention} what is the <b>status</b>?",
        "entities": [
            {
                "type": "mention",
                "text": mention,
                "mentioned": {"id": f"28:{APP_ID}", "name": "Assistant"},
            }
        ],
        "channelData": {
            "tenant": {"id": TENANT},
            "teamsTeamId": "19:team@thread.tacv2",
            "channel": {"id": TEAM_CHANNEL},
        },
    }
