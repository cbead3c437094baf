"""Isolation between users by credentials: a web token reads and writes only its own user's
messages, an export link yields only its maker's session (and guesses, altered tokens and
the stored hashes get 404), and no admin route answers without the admin token."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from storage.models import ExportLink, InboundEvent, User
from tests.e2e.harness import RunningGateway, running_gateway
from tests.reliability.isolation import (
    ADMIN_TOKEN,
    ALICE_TOKEN,
    ALICE_WORDS,
    BOB_TOKEN,
    BOB_WORDS,
    VAULT_CODE,
    WebUser,
    assert_nothing_of_bob,
    count_rows,
    isolation_config,
    session_state,
)

# --- the web API ---------------------------------------------------------------------------


async def test_a_web_token_reads_and_writes_only_its_own_users_messages(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(isolation_config(database_url, tmp_path)) as gateway:
        alice, bob = WebUser(gateway, "alice", ALICE_TOKEN), WebUser(gateway, "bob", BOB_TOKEN)
        bobs = (await bob.say(BOB_WORDS))["session_id"]
        alices = (await alice.say(ALICE_WORDS))["session_id"]
        before = await session_state(gateway, "bob")
        events_before = await count_rows(gateway, InboundEvent)

        client = gateway.client
        as_alice = {"Authorization": f"Bearer {ALICE_TOKEN}"}
        read_bob = await client.get("/web/v1/messages", params={"user": "bob"}, headers=as_alice)
        post_as_bob = await client.post(
            "/web/v1/messages", json={"user": "bob", "text": "I am Bob now"}, headers=as_alice
        )
        refused: dict[str, httpx.Response] = {
            "no token": await client.get("/web/v1/messages", params={"user": "bob"}),
            "no token, posting": await client.post(
                "/web/v1/messages", json={"user": "bob", "text": "I am Bob now"}
            ),
            "unknown token": await client.get(
                "/web/v1/messages", headers={"Authorization": "Bearer not-a-token"}
            ),
            "Bob's token cut short": await client.get(
                "/web/v1/messages", headers={"Authorization": f"Bearer {BOB_TOKEN[:-1]}"}
            ),
            "Bob's token, another scheme": await client.get(
                "/web/v1/messages", headers={"Authorization": f"Basic {BOB_TOKEN}"}
            ),
        }
        await asyncio.sleep(0.2)  # a message accepted by mistake would be answered by now
        alice_feed = await alice.feed()
        bob_feed = await bob.feed()
        after = await session_state(gateway, "bob")
        events_after = await count_rows(gateway, InboundEvent)

    for response in (read_bob, post_as_bob):
        assert (response.status_code, response.json()) == (
            403,
            {"error": "the token belongs to another user"},
        )
    for name, response in refused.items():
        assert response.status_code == 401, name
        assert response.json()["error"], name
    assert refused["no token"].json() == {"error": "missing bearer token"}
    assert refused["unknown token"].json() == {"error": "unknown token"}
    assert [reply["session_id"] for reply in alice_feed] == [alices]
    assert_nothing_of_bob(json.dumps(alice_feed), [bobs])
    assert VAULT_CODE in bob_feed[0]["text"]  # the secret is in Bob's own feed
    assert after == before
    assert events_after == events_before


# --- export links --------------------------------------------------------------------------


async def test_an_export_link_yields_only_its_makers_session_and_guesses_get_404(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(isolation_config(database_url, tmp_path)) as gateway:
        alice, bob = WebUser(gateway, "alice", ALICE_TOKEN), WebUser(gateway, "bob", BOB_TOKEN)
        bobs = (await bob.say(BOB_WORDS))["session_id"]
        bob_link = (await bob.say("/export"))["text"].rsplit(" ", 1)[1]
        alices = (await alice.say(ALICE_WORDS))["session_id"]
        alice_link = (await alice.say("/export"))["text"].rsplit(" ", 1)[1]
        async with gateway.runtime.database.session() as db:
            stored_hashes = list((await db.execute(select(ExportLink.token_hash))).scalars())

        client = gateway.client
        alices_export = await client.get(alice_link)
        bobs_export = await client.get(bob_link)
        token = alice_link.rsplit("/", 1)[1]
        altered = token[:-1] + ("A" if token[-1] != "A" else "B")
        guesses = [
            secrets.token_urlsafe(32),
            altered,
            token[:-1],
            *stored_hashes,  # what a copy of the database would give away
        ]
        guessed = [await client.get(f"/web/v1/exports/{guess}") for guess in guesses]
        with_bobs_token = await client.get(
            f"/web/v1/exports/{altered}", headers={"Authorization": f"Bearer {BOB_TOKEN}"}
        )
        await alice.say("/forget")
        await alice.say("/forget confirm")
        after_forget = await client.get(alice_link)
        bobs_after = await client.get(bob_link)

    assert alices_export.status_code == 200
    data = alices_export.json()
    assert (data["session_id"], data["user_id"]) == (alices, "alice")
    assert data["messages"][0]["content"] == ALICE_WORDS
    assert_nothing_of_bob(alices_export.text, [bobs])
    assert VAULT_CODE in bobs_export.text  # the secret is in Bob's own export
    assert len(stored_hashes) == 2
    for response in [*guessed, with_bobs_token, after_forget]:
        assert response.status_code == 404
        assert response.json() == {"error": "unknown or expired export link"}
    assert bobs_after.status_code == 200
    assert bobs_after.json()["session_id"] == bobs


# --- the admin API -------------------------------------------------------------------------


def admin_routes(session_id: str, user_id: str) -> list[tuple[str, str]]:
    """Every route of the admin API, aimed at one session and one user."""
    return [
        ("GET", "/admin/v1/sessions"),
        ("GET", f"/admin/v1/sessions?user={user_id}"),
        ("GET", f"/admin/v1/sessions/{session_id}"),
        ("GET", f"/admin/v1/sessions/{session_id}/export"),
        ("POST", f"/admin/v1/sessions/{session_id}/archive"),
        ("DELETE", f"/admin/v1/sessions/{session_id}"),
        ("GET", "/admin/v1/users"),
        ("GET", f"/admin/v1/users/{user_id}"),
        ("GET", f"/admin/v1/users/{user_id}/export"),
        ("DELETE", f"/admin/v1/users/{user_id}"),
    ]


WRONG_ADMIN_CREDENTIALS = {
    "no header": None,
    "a wrong token": "Bearer not-the-admin-token",
    "Alice's web token": f"Bearer {ALICE_TOKEN}",
    "Bob's web token": f"Bearer {BOB_TOKEN}",
    "the admin token cut short": f"Bearer {ADMIN_TOKEN[:-1]}",
    "the admin token with more": f"Bearer {ADMIN_TOKEN}0",
    "the admin token, another scheme": f"Basic {ADMIN_TOKEN}",
}


async def everyones_state(gateway: RunningGateway) -> dict[str, Any]:
    """The users, and the state of Alice's and Bob's sessions."""
    async with gateway.runtime.database.session() as db:
        users = sorted((await db.execute(select(User.id))).scalars())
    return {
        "users": users,
        "alice": await session_state(gateway, "alice"),
        "bob": await session_state(gateway, "bob"),
    }


async def test_every_admin_route_refuses_requests_without_the_admin_token(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(isolation_config(database_url, tmp_path)) as gateway:
        alice, bob = WebUser(gateway, "alice", ALICE_TOKEN), WebUser(gateway, "bob", BOB_TOKEN)
        bobs = (await bob.say(BOB_WORDS))["session_id"]
        await alice.say(ALICE_WORDS)
        before = await everyones_state(gateway)

        answers = {}
        for method, path in admin_routes(bobs, "bob"):
            for name, header in WRONG_ADMIN_CREDENTIALS.items():
                headers = {"Authorization": header} if header else {}
                answers[method, path, name] = await gateway.client.request(
                    method, path, headers=headers
                )
        after = await everyones_state(gateway)
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        shown = await gateway.client.get(f"/admin/v1/sessions/{bobs}", headers=admin)

    assert len(answers) == 10 * len(WRONG_ADMIN_CREDENTIALS)
    for key, answer in answers.items():
        assert answer.status_code == 401, key
        assert answer.json() == {"error": "a valid admin bearer token is required"}, key
        assert VAULT_CODE not in answer.text, key
    assert after == before
    assert before["users"] == ["alice", "bob"]
    # The routes are there: with the admin token the same request shows Bob's words.
    assert shown.status_code == 200
    assert VAULT_CODE in shown.text


async def test_without_an_admin_token_configured_the_admin_routes_do_not_exist(
    database_url: str, tmp_path: Path
) -> None:
    config = isolation_config(database_url, tmp_path, admin_token=None)
    async with running_gateway(config) as gateway:
        bob = WebUser(gateway, "bob", BOB_TOKEN)
        bobs = (await bob.say(BOB_WORDS))["session_id"]
        before = await everyones_state(gateway)
        answers = {}
        for method, path in admin_routes(bobs, "bob"):
            for header in (None, f"Bearer {ADMIN_TOKEN}", f"Bearer {BOB_TOKEN}"):
                headers = {"Authorization": header} if header else {}
                answers[method, path, header] = await gateway.client.request(
                    method, path, headers=headers
                )
        after = await everyones_state(gateway)

    assert {key: answer.status_code for key, answer in answers.items()} == dict.fromkeys(
        answers, 404
    )
    assert all(VAULT_CODE not in answer.text for answer in answers.values())
    assert after == before
