"""Activities into the Teams channel served by a real uvicorn on loopback, against a fake Bot
Framework (OpenID metadata, token endpoint, Bot Connector) with real RS256 tokens and the real
botbuilder SDK: what is accepted and answered, and what is refused with which status."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from channels.base import ChannelType
from errors import StorageError
from tests.channels.teams_activities import (
    ALICE_AAD,
    PERSONAL_CONVERSATION,
    TEAM_CHANNEL,
    TENANT,
    channel_mention,
    personal_message,
)
from tests.channels.teams_channel_harness import (
    ServedChannel,
    reply_to,
    serve_channel,
)
from tests.fakes.bot_framework import (
    APP_ID,
    FakeBotFramework,
    free_port,
    stranger_key,
)

# --- inbound: the happy paths ----------------------------------------------------------------


async def test_a_personal_message_with_a_valid_token_is_accepted_and_gets_one_reply(
    teams: ServedChannel,
) -> None:
    response = await teams.post(personal_message(teams.fake))

    assert response.status_code == 200
    [message] = teams.inbox.accepted
    assert message.channel_type is ChannelType.TEAMS
    assert message.user_identifier == ALICE_AAD
    assert message.tenant == TENANT
    assert message.channel_id == PERSONAL_CONVERSATION
    assert message.thread_id == ""
    assert message.content == "hello there"

    receipt = await teams.channel.send(reply_to(message, "**Done.** See `x`."))

    [posted] = teams.fake.posted
    assert receipt.platform_message_id == "reply-1"
    assert posted.conversation_id == PERSONAL_CONVERSATION
    assert posted.reply_to_id == "1717243200001"
    assert posted.body["type"] == "message"
    assert posted.body["text"] == "**Done.** See `x`."
    assert posted.body["textFormat"] == "markdown"
    assert posted.body["recipient"]["aadObjectId"] == ALICE_AAD
    assert posted.authorization == "Bearer connector-token-1"


async def test_a_channel_mention_is_answered_in_the_same_reply_chain(teams: ServedChannel) -> None:
    response = await teams.post(channel_mention(teams.fake))

    assert response.status_code == 200
    [message] = teams.inbox.accepted
    assert message.content == "what is the status?"
    assert message.channel_id == TEAM_CHANNEL
    assert message.thread_id == "1717243100000"

    await teams.channel.send(reply_to(message))

    [posted] = teams.fake.posted
    assert posted.conversation_id == f"{TEAM_CHANNEL};messageid=1717243100000"
    assert posted.reply_to_id == "1717243200002"
    assert posted.body["conversation"]["id"] == f"{TEAM_CHANNEL};messageid=1717243100000"


async def test_a_resent_activity_is_acknowledged_but_stored_once(teams: ServedChannel) -> None:
    first = await teams.post(personal_message(teams.fake))
    again = await teams.post(personal_message(teams.fake))
    assert (first.status_code, again.status_code) == (200, 200)
    assert teams.inbox.calls == 2
    assert len(teams.inbox.accepted) == 1


async def test_a_channel_message_without_a_mention_is_ignored_with_a_log_line(
    teams: ServedChannel,
) -> None:
    activity = channel_mention(teams.fake)
    activity["entities"] = []
    activity["text"] = "just chatting among humans"
    with capture_logs() as logs:
        response = await teams.post(activity)
    assert response.status_code == 200
    assert teams.inbox.calls == 0
    [ignored] = [entry for entry in logs if entry["event"] == "teams.ignored"]
    assert "without a mention" in ignored["reason"]


async def test_the_bot_added_to_a_team_posts_a_welcome(teams: ServedChannel) -> None:
    activity = {
        "type": "conversationUpdate",
        "id": "f:update-1",
        "serviceUrl": teams.fake.service_url,
        "channelId": "msteams",
        "from": {"id": "29:1alice", "aadObjectId": ALICE_AAD},
        "recipient": {"id": f"28:{APP_ID}", "name": "Assistant"},
        "conversation": {"id": TEAM_CHANNEL, "conversationType": "channel", "tenantId": TENANT},
        "membersAdded": [{"id": f"28:{APP_ID}"}],
        "channelData": {"tenant": {"id": TENANT}, "eventType": "teamMemberAdded"},
    }
    response = await teams.post(activity)
    assert response.status_code == 200
    assert teams.inbox.calls == 0
    [welcome] = teams.fake.posted
    assert welcome.conversation_id == TEAM_CHANNEL
    assert welcome.reply_to_id is None
    assert "/help" in welcome.body["text"]


async def test_a_too_long_message_gets_a_polite_reply_and_is_not_processed(
    fake: FakeBotFramework,
) -> None:
    async with serve_channel(fake, max_text_chars=20) as teams:
        response = await teams.post(personal_message(fake, text="x" * 21))
    assert response.status_code == 200
    assert teams.inbox.calls == 0
    [polite] = fake.posted
    assert "too long" in polite.body["text"]
    assert polite.conversation_id == PERSONAL_CONVERSATION
    assert teams.rejections == [(413, "message longer than 20 characters")]


async def test_a_failed_welcome_is_logged_and_still_acknowledged(teams: ServedChannel) -> None:
    teams.fake.fail_next(500)
    activity = {
        "type": "conversationUpdate",
        "serviceUrl": teams.fake.service_url,
        "channelId": "msteams",
        "recipient": {"id": f"28:{APP_ID}"},
        "conversation": {"id": PERSONAL_CONVERSATION, "conversationType": "personal"},
        "membersAdded": [{"id": f"28:{APP_ID}"}],
        "channelData": {"tenant": {"id": TENANT}},
    }
    with capture_logs() as logs:
        response = await teams.post(activity)
    assert response.status_code == 200
    assert teams.fake.posted == []
    assert any(entry["event"] == "teams.courtesy_reply_failed" for entry in logs)


# --- inbound: refusals -----------------------------------------------------------------------


def _bad_headers(fake: FakeBotFramework) -> dict[str, dict[str, str]]:
    return {
        "missing token": {},
        "malformed Authorization header": {"Authorization": f"Basic {fake.mint_token()}"},
        "token expired": fake.bearer(expires_in=-3600),
        "wrong audience": fake.bearer(audience="00000000-1111-2222-3333-444444444444"),
        "wrong issuer": fake.bearer(issuer="https://sts.example.com/"),
        "unknown signing key id": fake.bearer(key_id="no-such-key"),
        "bad token signature": fake.bearer(key=stranger_key()),
        "service URL mismatch": fake.bearer(service_url="https://smba.attacker.example/amer/"),
    }


BAD_TOKEN_CASES = [
    "missing token",
    "malformed Authorization header",
    "token expired",
    "wrong audience",
    "wrong issuer",
    "unknown signing key id",
    "bad token signature",
    "service URL mismatch",
]


@pytest.mark.parametrize("case", BAD_TOKEN_CASES)
async def test_a_bad_token_is_refused_with_401_and_nothing_is_processed(
    teams: ServedChannel, case: str
) -> None:
    headers = _bad_headers(teams.fake)[case]
    with capture_logs() as logs:
        response = await teams.post(personal_message(teams.fake), headers=headers)

    assert response.status_code == 401
    assert response.json() == {"error": case}
    assert teams.inbox.calls == 0
    assert teams.fake.posted == []
    assert teams.rejections == [(401, case)]
    [rejected] = [entry for entry in logs if entry["event"] == "teams.auth_rejected"]
    assert rejected["reason"] == case
    assert rejected["status"] == 401


async def test_a_tenant_not_on_the_allow_list_is_refused(teams: ServedChannel) -> None:
    activity = personal_message(teams.fake)
    activity["channelData"]["tenant"]["id"] = "11111111-2222-3333-4444-555555555555"
    activity["conversation"]["tenantId"] = "11111111-2222-3333-4444-555555555555"
    with capture_logs() as logs:
        response = await teams.post(activity)
    assert response.status_code == 401
    assert teams.inbox.calls == 0
    [rejected] = [entry for entry in logs if entry["event"] == "teams.auth_rejected"]
    assert "not allowed" in rejected["reason"]


async def test_a_key_not_endorsed_for_the_activity_s_channel_is_refused(
    teams: ServedChannel,
) -> None:
    activity = personal_message(teams.fake)
    activity["channelId"] = "webchat"  # the fake's key is endorsed for msteams only
    response = await teams.post(activity)
    assert response.status_code == 401
    assert response.json() == {"error": "signing key not endorsed for this channel"}
    assert teams.inbox.calls == 0


async def test_the_same_token_is_accepted_once_the_validation_would_pass(
    teams: ServedChannel,
) -> None:
    # The control case for the refusals above: only the one broken property differs.
    response = await teams.post(personal_message(teams.fake), headers=teams.fake.bearer())
    assert response.status_code == 200
    assert teams.fake.metadata_requests == 1


async def test_insecure_dev_mode_skips_token_validation(fake: FakeBotFramework) -> None:
    async with serve_channel(fake, insecure_dev_mode=True) as teams:
        response = await teams.post(personal_message(fake), headers={})
    assert response.status_code == 200
    assert len(teams.inbox.accepted) == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"type": "message", "channelId": "msteams"}', "needs 'serviceUrl'"),
    ],
)
async def test_a_malformed_activity_is_refused_with_400(
    teams: ServedChannel, body: bytes, reason: str
) -> None:
    response = await teams.client.post(
        "/api/messages",
        content=body,
        headers={**teams.fake.bearer(), "content-type": "application/json"},
    )
    assert response.status_code == 400
    assert reason in response.json()["error"]
    assert teams.inbox.calls == 0


async def test_a_message_activity_without_an_id_is_refused_with_400(teams: ServedChannel) -> None:
    activity = personal_message(teams.fake)
    del activity["id"]
    response = await teams.post(activity)
    assert response.status_code == 400
    assert teams.inbox.calls == 0


async def test_unreachable_signing_keys_answer_503_so_teams_resends(
    fake: FakeBotFramework,
) -> None:
    missing = f"http://127.0.0.1:{free_port()}/v1/.well-known/openidconfiguration"
    async with serve_channel(fake, openid_metadata_url=missing) as teams:
        with capture_logs() as logs:
            response = await teams.post(personal_message(fake))
    assert response.status_code == 503
    assert teams.inbox.calls == 0
    assert any(entry["event"] == "teams.signing_keys_failed" for entry in logs)


async def test_an_inbox_failure_answers_503_so_teams_resends(teams: ServedChannel) -> None:
    teams.inbox.failure = StorageError("database unreachable")
    response = await teams.post(personal_message(teams.fake))
    assert response.status_code == 503
    assert teams.rejections[0][0] == 503


async def test_a_refusal_quoting_a_lone_surrogate_is_still_json(teams: ServedChannel) -> None:
    # JSON may escape half of a UTF-16 pair; Python decodes it, UTF-8 cannot encode it back.
    activity = personal_message(teams.fake)
    activity["channelData"] = {"tenant": {"id": "tenant-\ud800"}}
    raw = json.dumps(activity, ensure_ascii=False).encode("utf-8", "surrogatepass")
    headers = {"Content-Type": "application/json", **teams.fake.bearer()}
    response = await teams.client.post("/api/messages", content=raw, headers=headers)
    assert response.status_code == 401
    assert response.json() == {"error": "tenant tenant-\ud800 not allowed"}
    assert teams.inbox.calls == 0
