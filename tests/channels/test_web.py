"""The web channel: parsing as a pure function, and every answer of its HTTP API."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from channels.base import ChannelType
from channels.web.adapter import MAX_BODY_BYTES
from channels.web.parse import namespaced_id, parse_web_message
from errors import ChannelPayloadError, RejectedRequestError
from storage.models import InboundEvent
from tests.e2e.harness import RunningGateway, gateway_config, running_gateway

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
ALICE_TOKEN = "t-alice-123456"
_json = {"content-type": "application/json"}
CLOSED_WEB = {"web": {"dev_open": False, "tokens": [{"token": ALICE_TOKEN, "user": "alice"}]}}


def parse(body: object, *, user_id: str = "alice", max_text_chars: int = 100) -> Any:
    return parse_web_message(body, user_id=user_id, now=NOW, max_text_chars=max_text_chars)


# --- parsing ---------------------------------------------------------------------------------


def test_a_message_is_normalised_with_a_namespaced_id() -> None:
    body = {"user": "alice", "text": "hello", "message_id": "m-1"}
    message = parse(body)
    assert message.channel_type is ChannelType.WEB
    assert message.channel_id == "alice"
    assert message.user_identifier == "alice"
    assert message.message_id == "alice:m-1"
    assert message.content == "hello"
    assert message.timestamp == NOW
    assert message.thread_id == ""
    assert message.reply_context == {"client_message_id": "m-1"}
    assert message.raw == body


def test_a_message_without_an_id_gets_a_generated_one() -> None:
    first = parse({"text": "one"})
    second = parse({"text": "one"})
    client_id = first.reply_context["client_message_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", client_id)
    assert first.message_id == f"alice:{client_id}"
    assert first.message_id != second.message_id


def test_the_thread_id_is_kept() -> None:
    message = parse({"text": "in a thread", "thread_id": "t-1.2@x"})
    assert message.thread_id == "t-1.2@x"


def test_the_same_client_id_from_two_users_gives_two_message_ids() -> None:
    assert parse({"text": "a", "message_id": "m-1"}, user_id="alice").message_id != (
        parse({"text": "a", "message_id": "m-1"}, user_id="bob").message_id
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [(("a:b", "c"), ("a", "b:c")), (("alice:x", "m1"), ("alice", "x:m1"))],
    ids=["short", "impersonating"],
)
def test_namespaced_ids_of_different_users_never_collide(
    first: tuple[str, str], second: tuple[str, str]
) -> None:
    # The inbox dedupes on the namespaced id, so a collision would drop one user's message as
    # the other's duplicate: user ids containing the separator are refused, and the ids of
    # the users that remain differ.
    assert namespaced_id(*first) == namespaced_id(*second)
    colliding = [pair for pair in (first, second) if ":" in pair[0]]
    for user_id, message_id in colliding:
        with pytest.raises(ChannelPayloadError, match="web user id"):
            parse({"text": "hi", "message_id": message_id}, user_id=user_id)
    accepted = [pair for pair in (first, second) if ":" not in pair[0]]
    assert len(accepted) == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([{"text": "hi"}], "JSON object"),
        ("hi", "JSON object"),
        ({"text": "hi", "colour": "red"}, "colour"),
        ({"text": "hi", "attachments": [], "zeta": 1}, "attachments, zeta"),
        ({}, "'text'"),
        ({"text": ""}, "'text'"),
        ({"text": " \n\t "}, "'text'"),
        ({"text": 42}, "'text'"),
        ({"text": "hi", "message_id": ""}, "'message_id'"),
        ({"text": "hi", "message_id": "has space"}, "'message_id'"),
        ({"text": "hi", "message_id": "x" * 201}, "'message_id'"),
        ({"text": "hi", "message_id": 7}, "'message_id'"),
        ({"text": "hi", "message_id": "a/b"}, "'message_id'"),
        ({"text": "hi", "thread_id": "../etc"}, "'thread_id'"),
        ({"text": "hi", "thread_id": ["t"]}, "'thread_id'"),
    ],
    ids=[
        "list",
        "string",
        "unknown-field",
        "unknown-fields",
        "no-text",
        "empty-text",
        "blank-text",
        "number-text",
        "empty-id",
        "id-with-space",
        "id-too-long",
        "id-not-a-string",
        "id-with-slash",
        "thread-with-slash",
        "thread-not-a-string",
    ],
)
def test_a_malformed_body_raises_a_payload_error_naming_the_problem(
    body: object, reason: str
) -> None:
    with pytest.raises(ChannelPayloadError, match=re.escape(reason)):
        parse(body)


def test_ids_of_200_allowed_characters_are_accepted() -> None:
    longest = "aA0._:@+-" * 22 + "ab"
    assert len(longest) == 200
    assert parse({"text": "hi", "message_id": longest}).message_id == f"alice:{longest}"


def test_text_over_the_limit_is_refused_with_413() -> None:
    assert parse({"text": "x" * 100}, max_text_chars=100).content == "x" * 100
    with pytest.raises(RejectedRequestError) as refused:
        parse({"text": "x" * 101}, max_text_chars=100)
    assert refused.value.status == 413
    assert "100 characters" in refused.value.reason


# --- over HTTP -------------------------------------------------------------------------------


@pytest.fixture
async def open_gateway(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    """A gateway whose web channel trusts the `user` field (dev_open), on SQLite."""
    config = gateway_config(
        f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        tmp_path,
        channels={"web": {"max_text_chars": 50}},
    )
    async with running_gateway(config) as gateway:
        yield gateway


async def rejected(gateway: RunningGateway, status: int) -> float:
    """The `gateway_messages_rejected_total` count of the web channel for one status."""
    text = (await gateway.client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_messages_rejected_total" and sample.labels == {
                "channel": "web",
                "reason": str(status),
            }:
                return sample.value
    return 0.0


async def inbound_count(gateway: RunningGateway) -> int:
    async with gateway.runtime.database.session() as db:
        return int(await db.scalar(select(func.count()).select_from(InboundEvent)) or 0)


async def assert_refused(
    gateway: RunningGateway, response: httpx.Response, status: int, reason: str
) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert isinstance(error, str)
    assert reason in error, error


async def test_malformed_json_gets_400_with_the_reason(open_gateway: RunningGateway) -> None:
    for count, body in enumerate([b'{"user": "alice", "text": ', b"", b"\xff\xfe{}"], start=1):
        response = await open_gateway.client.post("/web/v1/messages", content=body, headers=_json)
        await assert_refused(open_gateway, response, 400, "not valid JSON")
        assert await rejected(open_gateway, 400) == count


async def test_json_that_is_not_an_object_gets_400_saying_so(open_gateway: RunningGateway) -> None:
    bodies = [b'[{"user": "alice", "text": "hi"}]', b'"alice"', b"42", b"null"]
    for count, body in enumerate(bodies, start=1):
        response = await open_gateway.client.post("/web/v1/messages", content=body, headers=_json)
        await assert_refused(open_gateway, response, 400, "JSON object")
        assert await rejected(open_gateway, 400) == count


async def test_bad_fields_get_400_with_the_reason_and_each_is_counted(
    open_gateway: RunningGateway,
) -> None:
    cases = [
        ({"user": "alice"}, "'text'"),
        ({"user": "alice", "text": "   "}, "'text'"),
        ({"user": "alice", "text": "hi", "sender": "x"}, "unknown field(s): sender"),
        ({"user": "alice", "text": "hi", "message_id": "no spaces"}, "'message_id'"),
        ({"text": "hi"}, "'user'"),
        ({"user": "al ice", "text": "hi"}, "'user'"),
    ]
    for count, (body, reason) in enumerate(cases, start=1):
        response = await open_gateway.client.post("/web/v1/messages", json=body)
        await assert_refused(open_gateway, response, 400, reason)
        assert await rejected(open_gateway, 400) == count
    assert await inbound_count(open_gateway) == 0


async def test_text_over_max_text_chars_gets_413(open_gateway: RunningGateway) -> None:
    response = await open_gateway.post("alice", "x" * 51)
    await assert_refused(open_gateway, response, 413, "longer than 50 characters")
    assert await rejected(open_gateway, 413) == 1
    assert (await open_gateway.post("alice", "x" * 50)).status_code == 202
    assert await inbound_count(open_gateway) == 1


async def test_a_body_over_one_mebibyte_gets_413_declared_or_chunked(
    open_gateway: RunningGateway,
) -> None:
    big = json.dumps({"user": "alice", "text": "x" * MAX_BODY_BYTES}).encode()
    response = await open_gateway.client.post("/web/v1/messages", content=big, headers=_json)
    await assert_refused(open_gateway, response, 413, f"larger than {MAX_BODY_BYTES} bytes")
    assert await rejected(open_gateway, 413) == 1

    async def chunks() -> AsyncIterator[bytes]:
        # No Content-Length: the size is only known once the body is read.
        yield b'{"user": "alice", "text": "'
        for _ in range(17):
            yield b"x" * 65_536
        yield b'"}'

    response = await open_gateway.client.post("/web/v1/messages", content=chunks(), headers=_json)
    await assert_refused(open_gateway, response, 413, f"larger than {MAX_BODY_BYTES} bytes")
    assert await rejected(open_gateway, 413) == 2
    assert await inbound_count(open_gateway) == 0


async def test_a_bad_cursor_or_limit_gets_400(open_gateway: RunningGateway) -> None:
    queries = ["after=abc", "after=-1", "after=1.5", "limit=0", "limit=501", "limit=x"]
    for count, query in enumerate(queries, start=1):
        response = await open_gateway.client.get(f"/web/v1/messages?user=alice&{query}")
        await assert_refused(open_gateway, response, 400, f"'{query.partition('=')[0]}'")
        assert await rejected(open_gateway, 400) == count
    assert (await open_gateway.client.get("/web/v1/messages?user=alice&after=0")).status_code == 200


async def test_the_chat_page_is_served(open_gateway: RunningGateway) -> None:
    response = await open_gateway.client.get("/web/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "<title>Assistant</title>" in response.text
    assert "const devOpen = true;" in response.text
    assert "__DEV_OPEN__" not in response.text


async def test_with_tokens_every_unauthenticated_request_is_refused_and_counted(
    tmp_path: Path,
) -> None:
    config = gateway_config(
        f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}", tmp_path, channels=CLOSED_WEB
    )
    body = {"user": "alice", "text": "hello"}
    cases: list[tuple[dict[str, str], dict[str, Any], int, str]] = [
        ({}, body, 401, "missing bearer token"),
        ({"authorization": "Bearer t-mallory-000000"}, body, 401, "unknown token"),
        ({"authorization": "Basic x"}, body, 401, "Bearer <token>"),
        ({"authorization": "Bearer"}, body, 401, "Bearer <token>"),
        ({"authorization": ALICE_TOKEN}, body, 401, "Bearer <token>"),
        ({"authorization": f"Bearer {ALICE_TOKEN}x"}, body, 401, "unknown token"),
        ({"authorization": f"Bearer {ALICE_TOKEN}"}, {**body, "user": "bob"}, 403, "another"),
    ]
    async with running_gateway(config) as gateway:
        counts = {401: 0, 403: 0}
        for headers, payload, status, reason in cases:
            response = await gateway.client.post("/web/v1/messages", json=payload, headers=headers)
            await assert_refused(gateway, response, status, reason)
            counts[status] += 1
            assert await rejected(gateway, status) == counts[status]
        for headers, params, status in [
            ({}, {"user": "alice"}, 401),
            ({"authorization": "Bearer nope-nope-nope"}, {}, 401),
            ({"authorization": f"Bearer {ALICE_TOKEN}"}, {"user": "bob"}, 403),
        ]:
            response = await gateway.client.get("/web/v1/messages", params=params, headers=headers)
            assert response.status_code == status
            assert response.json()["error"]
            counts[status] += 1
            assert await rejected(gateway, status) == counts[status]
        assert await inbound_count(gateway) == 0
        page = await gateway.client.get("/web/")
    assert "const devOpen = false;" in page.text


async def test_with_the_right_token_a_message_is_accepted_and_its_reply_read_back(
    database_url: str, tmp_path: Path
) -> None:
    config = gateway_config(database_url, tmp_path, channels=CLOSED_WEB)
    auth = {"authorization": f"Bearer {ALICE_TOKEN}"}
    async with running_gateway(config) as gateway:
        accepted = await gateway.client.post(
            "/web/v1/messages", json={"text": "hello there", "message_id": "m-1"}, headers=auth
        )
        same_user = await gateway.client.post(
            "/web/v1/messages", json={"user": "alice", "text": "me again"}, headers=auth
        )
        async with asyncio.timeout(15):
            while True:
                feed = await gateway.client.get("/web/v1/messages", headers=auth)
                assert feed.status_code == 200
                if len(feed.json()["messages"]) == 2:
                    break
                await asyncio.sleep(0.05)
        unauthenticated = await gateway.client.get("/web/v1/messages", params={"user": "alice"})
        after = await gateway.client.get(
            "/web/v1/messages", params={"after": feed.json()["cursor"]}, headers=auth
        )
    assert accepted.status_code == 202
    assert accepted.json() == {"message_id": "m-1", "duplicate": False}
    assert same_user.status_code == 202
    first, _second = feed.json()["messages"]
    assert first["in_reply_to"] == "m-1"
    assert first["role"] == "assistant"
    assert "hello there" in first["text"]
    assert unauthenticated.status_code == 401
    assert after.json()["messages"] == []
    assert after.json()["cursor"] == feed.json()["cursor"]
