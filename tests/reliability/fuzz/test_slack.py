"""Fuzzing Slack's Events API endpoint, POST /slack/events: signed or not, well-formed or not,
a request never gets a 5xx and every refusal says why."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings

from tests.e2e.harness import gateway_config
from tests.fakes.slack_api import (
    SIGNING_SECRET,
    TEAM,
    FakeSlackAPI,
)
from tests.reliability.fuzz.harness import (
    FUZZ,
    Answer,
    LoopThread,
    Target,
    gateway_on,
    known_bug,
    sqlite_url,
    tolerated,
)
from tests.reliability.fuzz.slack_inputs import (
    SLACK_DM,
    SlackRequest,
    slack_known_bug,
    slack_requests,
)
from tests.reliability.fuzz.strategies import (
    DEEP_JSON,
    OVERSIZED,
)

# A failing example is printed in full, however large (a warning would hide the failure).
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")


@pytest.fixture(scope="class")
def slack(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("slack")
    with FakeSlackAPI() as api:
        config = gateway_config(
            sqlite_url(folder),
            folder,
            identity={
                "users": [
                    {"id": "alice", "org": "acme", "name": "Alice", "slack": [f"{TEAM}:U0001"]}
                ]
            },
            channels={
                "slack": {
                    "enabled": True,
                    "bot_token": "xoxb-test",
                    "signing_secret": SIGNING_SECRET,
                    "api_base_url": api.url,
                }
            },
        )
        with gateway_on(loop, config) as target:
            yield target


def post_slack(slack: Target, request: SlackRequest) -> Answer:
    return slack.post("/slack/events", request.body, request.headers())


def _slack_dm(event_id: str, **event: Any) -> dict[str, Any]:
    envelope = copy.deepcopy(SLACK_DM)
    envelope["event_id"] = event_id
    envelope["event"].update(event)
    return envelope


SLACK_REGRESSIONS = [
    pytest.param(
        b"[1, 2]", "application/json", id="list-body", marks=known_bug("slack-non-object")
    ),
    pytest.param(b"null", "application/json", id="null-body", marks=known_bug("slack-non-object")),
    pytest.param(
        b"payload=%5B1%5D",
        "application/x-www-form-urlencoded",
        id="form-payload-list",
        marks=known_bug("slack-non-object"),
    ),
    pytest.param(
        json.dumps({**SLACK_DM, "event": None}).encode(),
        "application/json",
        id="event-null",
        marks=known_bug("slack-malformed-envelope"),
    ),
    pytest.param(
        json.dumps({**SLACK_DM, "event": "x", "event_id": "EvStr"}).encode(),
        "application/json",
        id="event-string",
        marks=known_bug("slack-malformed-envelope"),
    ),
    pytest.param(
        json.dumps(_slack_dm("EvType", type=[])).encode(),
        "application/json",
        id="event-type-list",
        marks=known_bug("slack-malformed-envelope"),
    ),
    pytest.param(
        json.dumps({**SLACK_DM, "authorizations": 5, "event_id": "EvAuth"}).encode(),
        "application/json",
        id="authorizations-number",
        marks=known_bug("slack-malformed-envelope"),
    ),
    pytest.param(
        json.dumps({**SLACK_DM, "team": 5, "event_id": "EvTeam"}).encode(),
        "application/json",
        id="team-number",
        marks=known_bug("slack-malformed-envelope"),
    ),
    pytest.param(
        json.dumps(_slack_dm("EvFiles", files=5)).encode(),
        "application/json",
        id="files-number",
        marks=known_bug("slack-malformed-envelope"),
    ),
    pytest.param(
        json.dumps(_slack_dm("EvSize", files=[{"size": "abc"}])).encode(),
        "application/json",
        id="file-size-text",
        marks=known_bug("slack-malformed-envelope"),
    ),
    pytest.param(
        json.dumps(_slack_dm("EvAtt", attachments=5)).encode(),
        "application/json",
        id="attachments-number",
        marks=known_bug("slack-malformed-envelope"),
    ),
    pytest.param(
        json.dumps(_slack_dm("EvTs", ts="1e300")).encode(),
        "application/json",
        id="ts-out-of-range",
        marks=known_bug("slack-timestamp-range"),
    ),
    pytest.param(
        json.dumps(
            _slack_dm("EvShareTs", attachments=[{"is_share": True, "text": "x", "ts": "inf"}])
        ).encode(),
        "application/json",
        id="shared-ts-infinite",
        marks=known_bug("slack-timestamp-range"),
    ),
    pytest.param(
        json.dumps(_slack_dm("Ev\ud800")).encode(),
        "application/json",
        id="event-id-lone-surrogate",
        marks=known_bug("surrogates"),
    ),
    pytest.param(
        json.dumps(_slack_dm("EvUser", user="U\udc00")).encode(),
        "application/json",
        id="user-lone-surrogate",
        marks=known_bug("surrogates"),
    ),
    pytest.param(
        DEEP_JSON, "application/json", id="deeply-nested", marks=known_bug("json-nesting")
    ),
    pytest.param(
        b"\x80" + json.dumps(_slack_dm("EvLatin")).encode(),
        "application/json",
        id="not-utf8",
        marks=known_bug("slack-non-utf8-body"),
    ),
    pytest.param(json.dumps(_slack_dm("EvOk")).encode(), "application/json", id="valid-dm"),
]


class TestSlackChannel:
    """Slack's Events API endpoint: POST /slack/events."""

    def test_requests_never_get_a_5xx_and_refusals_say_why(self, slack: Target) -> None:
        seen: Counter[str] = Counter()

        @settings(FUZZ, max_examples=600)
        @given(request=slack_requests)
        def example(request: SlackRequest) -> None:
            answer = post_slack(slack, request)
            seen[f"{'signed' if request.signing == 'valid' else 'unsigned'} {answer.status}"] += 1
            bug = slack_known_bug(request.body, request.content_type)
            if answer.status >= 500 and tolerated(bug):
                seen[f"known bug {bug}"] += 1
                return
            if request.signing != "valid":
                assert answer.status == 401, answer
                assert answer.reason, answer
                return
            # 503 means "the database failed, retry": it did not, here.
            assert answer.status in (200, 400, 413), answer
            if answer.status != 200:
                assert answer.reason, answer

        example()
        assert {"signed 200", "signed 400", "unsigned 401"} <= set(seen), seen
        slack.assert_healthy()
        slack.assert_no_failed_turns()

    @pytest.mark.parametrize(("body", "content_type"), SLACK_REGRESSIONS)
    def test_signed_malformed_payloads_get_a_4xx_or_200_never_a_500(
        self, slack: Target, body: bytes, content_type: str
    ) -> None:
        answer = post_slack(slack, SlackRequest(body, content_type, "valid"))
        assert answer.status in (200, 400), answer

    @pytest.mark.parametrize(
        "body",
        [
            pytest.param(b"\xff\xfe{}", id="not-utf8", marks=known_bug("slack-non-utf8-body")),
            pytest.param(b"{}", id="utf8"),
        ],
    )
    def test_a_request_with_a_wrong_signature_gets_401_whatever_its_body(
        self, slack: Target, body: bytes
    ) -> None:
        answer = post_slack(slack, SlackRequest(body, "application/json", "garbled"))
        assert answer.status == 401, answer

    def test_a_signed_body_over_a_megabyte_gets_413_with_a_reason(self, slack: Target) -> None:
        answer = post_slack(slack, SlackRequest(OVERSIZED, "application/json", "valid"))
        assert (answer.status, answer.reason) == (413, "the request body is too large")
