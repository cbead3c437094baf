"""Fuzzing the Bot Framework endpoint, POST /api/messages: an activity with a valid token never
gets a 5xx, however malformed."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.channels.teams_activities import ALICE_AAD, TENANT, channel_mention, personal_message
from tests.e2e.harness import gateway_config
from tests.fakes.bot_framework import APP_ID, APP_PASSWORD, FakeBotFramework
from tests.reliability.fuzz.harness import (
    FUZZ,
    Answer,
    LoopThread,
    Target,
    gateway_on,
    has_surrogate,
    json_failure,
    known_bug,
    sqlite_url,
    tolerated,
)
from tests.reliability.fuzz.strategies import (
    DEEP_JSON,
    HOSTILE_JSON,
    OVERSIZED,
    damaged,
    huge_text,
    json_bytes,
    json_values,
    mutated,
    nasty_text,
    with_surrogate,
)

# A failing example is printed in full, however large (a warning would hide the failure).
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

teams_junk = st.one_of(
    json_values,
    nasty_text,
    huge_text,
    st.sampled_from(
        [
            "message",
            "conversationUpdate",
            "messageReaction",
            "invoke",
            "typing",
            "personal",
            "channel",
            "groupChat",
            "msteams",
            "mention",
            "text/html",
            "application/vnd.microsoft.teams.file.download.info",
            "<at>Assistant</at> hi",
            "<p>Hello <b>there</b> &amp; &#9731;</p>",
            "2025-06-01T12:00:00Z",
            "2025-13-45T99:99:99",
            f"28:{APP_ID}",
            APP_ID,
            ALICE_AAD,
            TENANT,
            "a:1/../x",
        ]
    ),
)
teams_keys = st.one_of(
    st.sampled_from(
        [
            "type",
            "id",
            "text",
            "from",
            "conversation",
            "recipient",
            "entities",
            "attachments",
            "membersAdded",
            "channelData",
            "replyToId",
            "timestamp",
            "aadObjectId",
            "conversationType",
            "tenantId",
            "isGroup",
            "value",
        ]
    ),
    st.text(max_size=8),
)
# Mutating these fails authentication (401), which is fine but reaches nothing beyond it.
TEAMS_AUTH_FIELDS = frozenset({"serviceUrl", "channelId"})


def bot_added(fake: FakeBotFramework) -> dict[str, Any]:
    """The conversationUpdate that installs the bot in a personal chat."""
    return {
        "type": "conversationUpdate",
        "id": "f:bot-added",
        "timestamp": "2025-06-01T12:00:00Z",
        "serviceUrl": fake.service_url,
        "channelId": "msteams",
        "from": {"id": "29:1alice", "aadObjectId": ALICE_AAD},
        "conversation": {
            "id": "a:1personal-chat-with-alice",
            "conversationType": "personal",
            "tenantId": TENANT,
        },
        "recipient": {"id": f"28:{APP_ID}", "name": "Assistant"},
        "membersAdded": [{"id": f"28:{APP_ID}"}],
        "channelData": {"tenant": {"id": TENANT}},
    }


def teams_activities(fake: FakeBotFramework) -> st.SearchStrategy[bytes]:
    bases = st.sampled_from([personal_message(fake), channel_mention(fake), bot_added(fake)])
    return st.one_of(
        bases.flatmap(
            lambda base: json_bytes(mutated(base, teams_junk, teams_keys, TEAMS_AUTH_FIELDS))
        ),
        bases.flatmap(
            lambda base: json_bytes(
                mutated(base, with_surrogate(teams_junk), teams_keys, TEAMS_AUTH_FIELDS)
            )
        ),
        bases.flatmap(lambda base: json_bytes(mutated(base, teams_junk, teams_keys))),
        json_bytes(json_values),
        damaged(json_bytes(bases)),
        st.binary(max_size=200),
        st.sampled_from(HOSTILE_JSON),
    )


def teams_known_bug(raw: bytes) -> str | None:
    """The known bug class a Teams body (with a valid token) belongs to, if any."""
    failure = json_failure(raw)
    if failure is not None:
        return failure
    try:
        activity = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(activity, dict):
        return None
    for key in ("attachments", "membersAdded"):
        value = activity.get(key)
        if value and not isinstance(value, list | str | dict):
            return "teams-malformed-activity"
    conversation = activity.get("conversation")
    if isinstance(conversation, dict) and "/" in str(conversation.get("id")):
        return "teams-connector-non-json"
    if has_surrogate(activity):
        return "surrogates"
    return None


@pytest.fixture(scope="class")
def teams_fake(loop: LoopThread) -> Iterator[FakeBotFramework]:
    stack = contextlib.AsyncExitStack()
    fake = loop.run(stack.enter_async_context(FakeBotFramework()))
    yield fake
    loop.run(stack.aclose())


@pytest.fixture(scope="class")
def teams(
    loop: LoopThread, teams_fake: FakeBotFramework, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("teams")
    config = gateway_config(
        sqlite_url(folder),
        folder,
        identity={"users": [{"id": "alice", "org": "acme", "teams": [ALICE_AAD]}]},
        channels={
            "teams": {
                "enabled": True,
                "app_id": APP_ID,
                "app_password": APP_PASSWORD,
                "tenant_ids": [TENANT],
                "openid_metadata_url": teams_fake.openid_metadata_url,
                "oauth_token_url": teams_fake.token_url,
            }
        },
    )
    with gateway_on(loop, config) as target:
        yield target


def post_teams(teams: Target, fake: FakeBotFramework, raw: bytes) -> Answer:
    headers = {"Content-Type": "application/json", **fake.bearer()}
    return teams.post("/api/messages", raw, headers)


class TestTeamsChannel:
    """The Bot Framework endpoint: POST /api/messages, with valid tokens."""

    def test_activities_with_a_valid_token_never_get_a_5xx(
        self, teams: Target, teams_fake: FakeBotFramework
    ) -> None:
        seen: Counter[str] = Counter()

        @settings(FUZZ, max_examples=500)
        @given(raw=teams_activities(teams_fake))
        def example(raw: bytes) -> None:
            answer = post_teams(teams, teams_fake, raw)
            seen[str(answer.status)] += 1
            if answer.status >= 500 and tolerated(teams_known_bug(raw)):
                seen[f"known bug {teams_known_bug(raw)}"] += 1
                return
            # 503 is for "not stored" or "signing keys unavailable": neither happens here.
            assert answer.status in (200, 400, 401, 413), answer
            if answer.status != 200:
                assert answer.reason, answer

        example()
        assert {"200", "400", "401"} <= set(seen), seen
        teams.assert_healthy()
        teams.assert_no_failed_turns()

    @pytest.mark.parametrize(
        "mutate",
        [
            pytest.param(
                lambda a: a.update(attachments=5, id="reg-attachments"),
                id="attachments-number",
                marks=known_bug("teams-malformed-activity"),
            ),
            pytest.param(
                lambda a: a.update(type="conversationUpdate", membersAdded=5),
                id="members-added-number",
                marks=known_bug("teams-malformed-activity"),
            ),
            pytest.param(
                lambda a: a.update(
                    type="conversationUpdate",
                    membersAdded=[{"id": f"28:{APP_ID}"}],
                    conversation={
                        "id": "a:1/x",
                        "conversationType": "personal",
                        "tenantId": TENANT,
                    },
                ),
                id="welcome-connector-answers-non-json",
                marks=known_bug("teams-connector-non-json"),
            ),
            pytest.param(
                lambda a: a.update(id="reg-\ud800"),
                id="activity-id-lone-surrogate",
                marks=known_bug("surrogates"),
            ),
            pytest.param(
                lambda a: a.update(
                    {"id": "reg-aad", "from": {"id": "29:1", "aadObjectId": "\ud800"}}
                ),
                id="aad-object-id-lone-surrogate",
                marks=known_bug("surrogates"),
            ),
            pytest.param(lambda a: a.update(id="reg-valid"), id="valid"),
        ],
    )
    def test_malformed_activities_get_a_4xx_or_200_never_a_500(
        self, teams: Target, teams_fake: FakeBotFramework, mutate: Any
    ) -> None:
        activity = personal_message(teams_fake)
        mutate(activity)
        answer = post_teams(teams, teams_fake, json.dumps(activity).encode())
        assert answer.status in (200, 400), answer

    @pytest.mark.parametrize(
        "raw",
        [
            pytest.param(DEEP_JSON, id="deeply-nested", marks=known_bug("json-nesting")),
            pytest.param(
                b'{"type": ' + b"9" * 5_000 + b"}",
                id="5000-digits",
                marks=known_bug("json-big-int"),
            ),
        ],
    )
    def test_json_the_parser_chokes_on_is_refused_with_400(
        self, teams: Target, teams_fake: FakeBotFramework, raw: bytes
    ) -> None:
        assert post_teams(teams, teams_fake, raw).status == 400

    def test_a_body_over_a_megabyte_gets_413_with_a_reason(
        self, teams: Target, teams_fake: FakeBotFramework
    ) -> None:
        answer = post_teams(teams, teams_fake, OVERSIZED)
        assert (answer.status, answer.reason) == (413, "the body is larger than 1048576 bytes")
