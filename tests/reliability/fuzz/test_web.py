"""Fuzzing the web API, POST /web/v1/messages: a 202 only for a valid message, a reason with
every refusal."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.web.adapter import ID_PATTERN, MAX_BODY_BYTES, USER_PATTERN
from storage.models import InboundStatus
from tests.e2e.harness import gateway_config
from tests.reliability.fuzz.harness import (
    FUZZ,
    Answer,
    LoopThread,
    Target,
    gateway_on,
    json_failure,
    known_bug,
    sqlite_url,
    tolerated,
)
from tests.reliability.fuzz.strategies import (
    DEEP_JSON,
    HOSTILE_JSON,
    MAX_TEXT_CHARS,
    OVERSIZED,
    damaged,
    huge_text,
    json_bytes,
    json_values,
    mutated,
    nasty_text,
    web_ids,
)

# A failing example is printed in full, however large (a warning would hide the failure).
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

WEB_TOKEN = "web-token-alice"
WEB_MESSAGE = {
    "user": "alice",
    "text": "What is an anvil?",
    "thread_id": "t-1",
    "message_id": "m-1",
}
web_junk = st.one_of(json_values, nasty_text, huge_text, web_ids)
web_keys = st.sampled_from(["user", "text", "thread_id", "message_id", "extra", "token", ""])
web_messages = st.fixed_dictionaries(
    {
        "user": st.sampled_from(["alice", "bob", "zed", "Zed.O'Neil", ""]),
        "text": st.one_of(nasty_text, nasty_text, nasty_text, huge_text),
    },
    optional={"thread_id": web_ids, "message_id": web_ids},
)
web_bodies = st.one_of(
    json_bytes(web_messages),
    json_bytes(web_messages),
    json_bytes(mutated(WEB_MESSAGE, web_junk, web_keys)),
    json_bytes(json_values),
    damaged(json_bytes(web_messages)),
    st.binary(max_size=200),
    st.sampled_from(HOSTILE_JSON),
)
web_authorizations = st.sampled_from(
    [None, None, None, f"Bearer {WEB_TOKEN}", "Bearer wrong", "Basic YWxpY2U6cHc=", "Bearer", ""]
)


def web_refusals(raw: bytes, authorization: str | None) -> set[int]:
    """The statuses the web API may refuse `raw` with, by its documented rules; empty when the
    message is valid and must be accepted (202)."""
    if len(raw) > MAX_BODY_BYTES:
        return {413}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return {400}
    if not isinstance(body, dict):
        return {400}
    refusals: set[int] = set()
    claimed = body.get("user")
    if authorization:  # an empty header counts as none
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or token.strip() != WEB_TOKEN:
            refusals.add(401)
        elif claimed not in (None, "", "alice"):
            refusals.add(403)
    elif not isinstance(claimed, str) or not USER_PATTERN.fullmatch(claimed):
        refusals.add(400)
    if set(body) - {"user", "text", "thread_id", "message_id"}:
        refusals.add(400)
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        refusals.add(400)
    elif len(text) > MAX_TEXT_CHARS:
        refusals.add(413)
    for field in ("thread_id", "message_id"):
        value = body.get(field)
        if value is not None and not (isinstance(value, str) and ID_PATTERN.fullmatch(value)):
            refusals.add(400)
    return refusals


@pytest.fixture(scope="class")
def web(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("web")
    config = gateway_config(
        sqlite_url(folder),
        folder,
        channels={"web": {"tokens": [{"token": WEB_TOKEN, "user": "alice"}]}},
    )
    with gateway_on(loop, config) as target:
        yield target


def post_web(web: Target, raw: bytes, authorization: str | None) -> Answer:
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    return web.post("/web/v1/messages", raw, headers)


class TestWebChannel:
    """The web API: POST /web/v1/messages."""

    def test_messages_get_202_only_when_valid_and_a_reason_with_every_refusal(
        self,
        web: Target,
    ) -> None:
        seen: Counter[str] = Counter()

        @settings(FUZZ, max_examples=400)
        @given(raw=web_bodies, authorization=web_authorizations)
        def example(raw: bytes, authorization: str | None) -> None:
            answer = post_web(web, raw, authorization)
            seen[str(answer.status)] += 1
            if answer.status >= 500 and tolerated(json_failure(raw)):
                seen[f"known bug {json_failure(raw)}"] += 1
                return
            assert answer.status < 500, answer
            refusals = web_refusals(raw, authorization)
            if not refusals:
                assert answer.status == 202, answer
                assert json.loads(answer.text)["message_id"]
            else:
                assert answer.status in refusals, (answer, refusals)
                assert str(json.loads(answer.text)["error"]).strip(), answer

        example()
        assert {"202", "400", "401", "403", "413"} <= set(seen), seen  # every rule was reached
        web.assert_healthy()
        web.assert_no_failed_turns()

    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            pytest.param(DEEP_JSON, 400, id="deeply-nested", marks=known_bug("json-nesting")),
            pytest.param(
                b'{"user": "alice", "text": ' + b"9" * 5_000 + b"}",
                400,
                id="5000-digit-number",
                marks=known_bug("json-big-int"),
            ),
            pytest.param(json.dumps({"user": "alice", "text": "hi"}).encode(), 202, id="valid"),
        ],
    )
    def test_json_the_parser_chokes_on_is_refused_with_400(
        self, web: Target, raw: bytes, expected: int
    ) -> None:
        answer = post_web(web, raw, None)
        assert answer.status == expected, answer

    @pytest.mark.parametrize(
        "text",
        [
            pytest.param("hi \ud800 there", id="lone-surrogate", marks=known_bug("surrogates")),
            pytest.param("hi \x00 there", id="nul"),
        ],
    )
    def test_text_with_odd_code_points_gets_its_turn_without_failures(
        self, web: Target, text: str
    ) -> None:
        client_id = f"odd-{sum(map(ord, text))}"
        raw = json.dumps({"user": "alice", "text": text, "message_id": client_id}).encode()
        assert post_web(web, raw, None).status == 202
        web.settle()
        (event,) = [e for e in web.events() if e.message_id == f"alice:{client_id}"]
        assert (event.status, event.attempts, event.error) == (InboundStatus.DONE, 0, None)

    def test_a_body_over_a_megabyte_gets_413_with_a_reason(self, web: Target) -> None:
        answer = post_web(web, OVERSIZED, None)
        assert (answer.status, answer.reason) == (413, "the body is larger than 1048576 bytes")
