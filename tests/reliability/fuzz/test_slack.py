"""Bad input, fuzzed with hypothesis: web requests, Slack payloads, Teams activities, raw mail and
config files. Whatever arrives, the gateway answers without a 5xx, a crash or a hang, and every
refusal says why.

Each channel's tests share one whole gateway (SQLite in a temporary folder) started in an event
loop on a thread of its own (`LoopThread`): a synchronous test runs an inner ``@given`` function
whose examples hand their requests to that loop and wait for the answer, so hundreds of
examples cost one gateway start. After the examples the test checks that the gateway is still
healthy (`/healthz`, `/readyz`, its background loops running) and that the dispatcher finished
every accepted message without a failed turn (`settle`). Examples are derandomized, so CI runs
the same ones every time.

Known bugs: a 5xx (or an exception) that a fuzz test runs into is a failure unless the input
belongs to a class listed in `KNOWN_BUGS`; each class also has precise regression cases, marked
``xfail(strict=True)`` while the id is listed. Fixing a bug means deleting its id: the regression
cases then must pass, and the fuzz tests stop tolerating that class.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import copy
import html
import json
import quopri
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiosmtplib
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slack_bolt.request.internals import parse_body
from sqlalchemy import select

from channels.base import ChannelMessage
from channels.email.parse import parse_email
from channels.web.adapter import ID_PATTERN, MAX_BODY_BYTES, USER_PATTERN
from errors import ChannelPayloadError
from gateway import outbox
from gateway.cli import main as gateway_cli
from gateway.config import check_config
from gateway.settings import GatewayConfig, parse_duration
from storage.models import InboundEvent, InboundStatus
from tests.channels.test_email_channel import GMAIL_FORWARD, OUTLOOK_FORWARD
from tests.channels.test_teams import ALICE_AAD, TENANT, channel_mention, personal_message
from tests.e2e.harness import RunningGateway, free_port, gateway_config, running_gateway
from tests.fakes.bot_framework import APP_ID, APP_PASSWORD, FakeBotFramework
from tests.fakes.slack_api import (
    BOT_USER,
    SIGNING_SECRET,
    TEAM,
    FakeSlackAPI,
    direct_message,
    event_envelope,
    sign,
)

# A failing example is printed in full, however large (a warning would hide the failure).
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

T = TypeVar("T")
KeyPath = tuple[str | int, ...]

REPO = Path(__file__).resolve().parents[3]
ASSISTANT = "assistant@acme.example"
WEB_TOKEN = "web-token-alice"
MAX_TEXT_CHARS = 16_000  # the channels' default max_text_chars
ANSWER_SECONDS = 20.0  # longer than this without an answer is a hang
SETTLE_SECONDS = 60.0  # the dispatcher finishes every accepted message within this

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)

# --- known bugs -------------------------------------------------------------------------------

KNOWN_BUGS: dict[str, str] = {}


def known_bug(bug: str) -> list[pytest.MarkDecorator]:
    """The marks of a regression case of `bug`: strict xfail while the bug is listed."""
    if bug in KNOWN_BUGS:
        return [pytest.mark.xfail(strict=True, reason=f"{bug}: {KNOWN_BUGS[bug]}")]
    return []


def tolerated(bug: str | None) -> bool:
    """Whether a failure caused by an input of class `bug` is a known, listed bug."""
    return bug is not None and bug in KNOWN_BUGS


# --- an event loop on a thread of its own -----------------------------------------------------


class LoopThread:
    """An asyncio loop running in a thread: synchronous hypothesis examples hand it coroutines
    (`run`) and wait for their results, while the servers started in it keep serving."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = ANSWER_SECONDS) -> T:
        """The coroutine's result; an AssertionError (a hang) when it takes over `timeout`."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise AssertionError(f"no answer within {timeout} s: a hang") from None

    def close(self) -> None:
        """Cancel what is left, stop the loop and join the thread."""

        async def cancel_the_rest() -> None:
            current = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

        self.run(cancel_the_rest(), timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, read to the end."""

    status: int
    text: str

    @property
    def reason(self) -> str:
        """The reason of a refusal: the JSON body's "error", else the plain-text body."""
        try:
            data = json.loads(self.text)
        except ValueError:
            return self.text.strip()
        return str(data.get("error") or "").strip() if isinstance(data, dict) else ""


@dataclass
class Target:
    """A running gateway and the loop it runs in."""

    loop: LoopThread
    gateway: RunningGateway

    def post(self, path: str, content: bytes, headers: Mapping[str, str]) -> Answer:
        """POST `content`; the answer (an AssertionError when none comes in time)."""

        async def post() -> Answer:
            response = await self.gateway.client.post(path, content=content, headers=headers)
            return Answer(response.status_code, response.text)

        return self.loop.run(post())

    def get(self, path: str) -> Answer:
        """GET `path`."""

        async def get() -> Answer:
            response = await self.gateway.client.get(path)
            return Answer(response.status_code, response.text)

        return self.loop.run(get())

    def assert_healthy(self) -> None:
        """Liveness and readiness answer 200 and the background loops still run."""
        assert self.get("/healthz").status == 200
        assert self.get("/readyz").status == 200
        # A bad payload must not have killed the dispatcher, the outbox or the job loops.
        loops = self.gateway.runtime._tasks
        assert loops
        assert all(not task.done() for task in loops), [t for t in loops if t.done()]

    def events(self) -> list[InboundEvent]:
        """Every inbound event in the database."""

        async def events() -> list[InboundEvent]:
            async with self.gateway.runtime.database.session() as db:
                return list((await db.execute(select(InboundEvent))).scalars())

        return self.loop.run(events())

    def settle(self) -> list[InboundEvent]:
        """Wait until every accepted message is finished; the events whose turn failed."""

        async def settle() -> list[InboundEvent]:
            deadline = time.monotonic() + SETTLE_SECONDS
            while True:
                async with self.gateway.runtime.database.session() as db:
                    events = list((await db.execute(select(InboundEvent))).scalars())
                pending = [e for e in events if e.status == InboundStatus.PENDING]
                if not pending:
                    return [e for e in events if e.attempts or e.status == InboundStatus.FAILED]
                if time.monotonic() > deadline:
                    raise AssertionError(f"{len(pending)} messages still pending: a hang")
                await asyncio.sleep(0.2)

        return self.loop.run(settle(), timeout=SETTLE_SECONDS + 10)

    def assert_no_failed_turns(self) -> None:
        """No turn failed, except on messages of a known bug class."""
        for failed in self.settle():
            bug = "surrogates" if has_surrogate(failed.message) else None
            assert tolerated(bug), f"a turn failed on {failed.message}: {failed.error}"


@contextlib.contextmanager
def gateway_on(loop: LoopThread, config: GatewayConfig) -> Iterator[Target]:
    """Run a whole gateway with `config` in `loop` for the duration of the block."""
    stack = contextlib.AsyncExitStack()
    gateway = loop.run(stack.enter_async_context(running_gateway(config)), timeout=60)
    try:
        yield Target(loop, gateway)
    finally:
        loop.run(stack.aclose(), timeout=90)


def sqlite_url(folder: Path) -> str:
    return f"sqlite+aiosqlite:///{folder / 'gateway.db'}"


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    with pytest.MonkeyPatch.context() as patch:
        # The outbox's retry jitter draws from the global random generator, which hypothesis
        # watches while it generates examples in the test's thread: give it a generator of its
        # own, or a retry in the gateway's thread makes a draw look non-deterministic.
        patch.setattr(outbox, "random", random.Random(0))
        thread = LoopThread()
        yield thread
        thread.close()


# --- generic strategies -----------------------------------------------------------------------

NASTY_STRINGS = [
    "",
    " ",
    "\t\r\n",
    "\x00",
    "a\x00b",
    "\x1b[31mred\x1b[0m",
    "\u202eevil\u202c",
    "\u200b\ufeff",
    "😀" * 5,
    "Ω≈ç√∫",
    "null",
    "0",
    "-1",
    "1e300",
    "inf",
    "NaN",
    "9" * 40,
    "../../etc/passwd",
    "<script>alert(1)</script>",
    "%s%n{0}",
    "'; DROP TABLE inbound_events; --",
]
nasty_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(NASTY_STRINGS),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x1F), max_size=10),
    st.text(st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF), max_size=10),
)
huge_text = st.sampled_from([4_000, MAX_TEXT_CHARS + 1]).map(lambda n: "x" * n)
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    nasty_text,
)
json_values = st.recursive(
    json_leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=10), children, max_size=4),
    ),
    max_leaves=12,
)


def _paths(node: Any, prefix: KeyPath = ()) -> Iterator[KeyPath]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _at(tree: Any, path: KeyPath) -> Any:
    for part in path:
        tree = tree[part]
    return tree


@st.composite
def mutated(
    draw: st.DrawFn,
    base: Any,
    junk: st.SearchStrategy[Any],
    keys: st.SearchStrategy[str],
    protected: frozenset[str] = frozenset(),
) -> Any:
    """`base` after one to four mutations: a key or item dropped, a value replaced by junk (a
    wrong type, a huge or strange string, a nested structure), an unknown key added. Keys in
    `protected` are never touched."""
    tree = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        paths = [p for p in _paths(tree) if not any(part in protected for part in p)]
        path = draw(st.sampled_from(paths))
        operation = draw(st.sampled_from(["drop", "replace", "add"]))
        if not path:
            if operation == "replace":
                tree = draw(junk)
            elif isinstance(tree, dict):
                tree[draw(keys)] = draw(junk)
            continue
        parent, last = _at(tree, path[:-1]), path[-1]
        target = parent[last]
        if operation == "drop":
            del parent[last]
        elif operation == "add" and isinstance(target, dict):
            target[draw(keys)] = draw(junk)
        elif operation == "add" and isinstance(target, list):
            target.append(draw(junk))
        else:
            parent[last] = draw(junk)
    return tree


@st.composite
def json_bytes(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> bytes:
    """A JSON document of one of `values`, ASCII-escaped or as UTF-8 (lone surrogates then
    become invalid UTF-8, which must be refused)."""
    value = draw(values)
    if draw(st.booleans()):
        return json.dumps(value).encode()
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def damaged(draw: st.DrawFn, documents: st.SearchStrategy[bytes]) -> bytes:
    """A document cut short, or with bytes overwritten, inserted or deleted."""
    data = bytearray(draw(documents))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        at = draw(st.integers(min_value=0, max_value=len(data)))
        operation = draw(st.sampled_from(["truncate", "overwrite", "insert", "delete"]))
        if operation == "truncate":
            del data[at:]
        elif operation == "overwrite" and at < len(data):
            data[at] = draw(st.integers(min_value=0, max_value=255))
        elif operation == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[at : at + draw(st.integers(min_value=1, max_value=8))]
    return bytes(data)


DEEP_JSON = b"[" * 5_000 + b"]" * 5_000  # deeper than the interpreter's recursion limit
HOSTILE_JSON = [
    DEEP_JSON,
    b'{"a":' + DEEP_JSON + b"}",
    b'{"a": ' + b"9" * 5_000 + b"}",
    b"",
    b"null",
    b"[]",
    b'"text"',
    b"NaN",
    b'{"a": Infinity, "b": -Infinity, "c": NaN}',
    b"\xef\xbb\xbf{}",
    json.dumps({"a": 1}).encode("utf-16"),
    b'{"a": "\\ud800"}',
    b'{"a": 1, "a": 2}',
    b"{" + b'"k":1,' * 2_000 + b'"k":1}',
]


OVERSIZED = json.dumps({"user": "alice", "text": "hi", "pad": "x" * MAX_BODY_BYTES}).encode()


def json_failure(raw: bytes) -> str | None:
    """The known bug a body's JSON parsing runs into (None when json.loads copes with it)."""
    try:
        json.loads(raw)
    except RecursionError:
        return "json-nesting"
    except json.JSONDecodeError:
        return None
    except UnicodeDecodeError:
        return None
    except ValueError:
        return "json-big-int"
    return None


def has_surrogate(value: Any) -> bool:
    """Whether a lone UTF-16 surrogate hides in any string (or key) of `value`."""
    if isinstance(value, str):
        return any("\ud800" <= char <= "\udfff" for char in value)
    if isinstance(value, Mapping):
        return any(has_surrogate(key) or has_surrogate(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return any(has_surrogate(item) for item in value)
    return False


def with_surrogate(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Now and then a lone surrogate instead of a value: rare, as it is a known bug."""
    return st.one_of(values, values, values, values, st.just("id\ud800"))


# --- web: POST /web/v1/messages ---------------------------------------------------------------

WEB_MESSAGE = {
    "user": "alice",
    "text": "What is an anvil?",
    "thread_id": "t-1",
    "message_id": "m-1",
}
web_ids = st.from_regex(r"[A-Za-z0-9._:@+-]{1,24}", fullmatch=True)
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


# --- Slack: POST /slack/events ----------------------------------------------------------------

SLACK_DM = event_envelope(direct_message("What is an anvil?", ts="1700000000.000100"), "EvDM")
SLACK_MENTION = event_envelope(
    {
        "type": "app_mention",
        "channel": "C0001",
        "user": "U0001",
        "text": f"<@{BOT_USER}> what about <@U0002>?",
        "ts": "1700000100.000100",
        "event_ts": "1700000100.000100",
        "files": [{"name": "a.txt", "mimetype": "text/plain", "size": 3}],
        "attachments": [
            {"is_share": True, "author_id": "U0002", "text": "shared", "ts": "1700000000.1"}
        ],
    },
    "EvMention",
)
SLACK_SHORTCUT = {
    "type": "message_action",
    "callback_id": "send_to_assistant",
    "trigger_id": "13345224609.738474920.8088930838d88f008e0",
    "action_ts": "1700000400.000100",
    "team": {"id": TEAM, "domain": "acme"},
    "user": {"id": "U0001", "username": "alice", "team_id": TEAM},
    "channel": {"id": "C0002", "name": "deals"},
    "message": {"type": "message", "user": "U0009", "text": "300 anvils", "ts": "1700000350.2"},
    "message_ts": "1700000350.2",
}
slack_junk = st.one_of(
    json_values,
    nasty_text,
    huge_text,
    st.sampled_from(
        [
            "message",
            "app_mention",
            "event_callback",
            "url_verification",
            "app_rate_limited",
            "block_actions",
            "message_action",
            "shortcut",
            "reaction_added",
            "app_home_opened",
            "member_joined_channel",
            "message_changed",
            "message_deleted",
            "bot_message",
            "file_share",
            "thread_broadcast",
            "im",
            "channel",
            TEAM,
            "U0001",
            BOT_USER,
            "D0001",
            "1700000000.000100",
            f"<@{BOT_USER}>",
        ]
    ),
)
slack_keys = st.one_of(
    st.sampled_from(
        [
            "type",
            "subtype",
            "event",
            "event_id",
            "team_id",
            "user",
            "channel",
            "channel_type",
            "ts",
            "thread_ts",
            "text",
            "bot_id",
            "files",
            "attachments",
            "authorizations",
            "enterprise",
            "team",
            "challenge",
            "is_ext_shared_channel",
            "response_urls",
            "view",
            "message",
        ]
    ),
    st.text(max_size=8),
)
slack_envelopes = st.one_of(
    mutated(SLACK_DM, with_surrogate(slack_junk), slack_keys),
    mutated(SLACK_DM, slack_junk, slack_keys, protected=frozenset({"event_id"})),
    mutated(SLACK_MENTION, slack_junk, slack_keys),
    json_values,
)


def _as_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def _form_quote(text: str) -> str:
    return quote(text, safe="", errors="surrogatepass")


slack_forms = st.one_of(
    st.builds(
        lambda payload: "payload=" + _form_quote(payload),
        st.one_of(
            st.text(max_size=40),
            json_bytes(mutated(SLACK_SHORTCUT, slack_junk, slack_keys)).map(_as_text),
            json_bytes(json_values).map(_as_text),
        ),
    ),
    st.text(max_size=40),
).map(lambda text: text.encode("utf-8", "surrogatepass"))
slack_content_types = st.sampled_from(
    ["application/json", "application/x-www-form-urlencoded", "text/plain", ""]
)


@dataclass(frozen=True)
class SlackRequest:
    """A request to /slack/events: its body and how it is signed."""

    body: bytes
    content_type: str
    signing: str  # "valid", or how the signature is broken

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": self.content_type} if self.content_type else {}
        now = int(time.time())
        signed = sign(self.body, timestamp=now)
        if self.signing == "valid":
            headers.update(signed)
        elif self.signing == "wrong secret":
            headers.update(sign(self.body, secret="not-the-secret", timestamp=now))
        elif self.signing == "stale":
            headers.update(sign(self.body, timestamp=now - 3600))
        elif self.signing == "future":
            headers.update(sign(self.body, timestamp=now + 3600))
        elif self.signing == "not a number":
            headers.update({**signed, "X-Slack-Request-Timestamp": "12ab"})
        elif self.signing == "garbled":
            headers.update({**signed, "X-Slack-Signature": "v0=" + "0" * 64})
        elif self.signing == "other body":
            headers.update(sign(self.body + b" ", timestamp=now))
        elif self.signing == "no timestamp":
            headers["X-Slack-Signature"] = signed["X-Slack-Signature"]
        return headers  # "unsigned": no signature headers at all


signed_envelopes = st.builds(
    SlackRequest,
    body=json_bytes(slack_envelopes),
    content_type=st.just("application/json"),
    signing=st.just("valid"),
)
slack_requests = st.one_of(
    signed_envelopes,
    signed_envelopes,
    signed_envelopes,
    st.builds(
        SlackRequest,
        body=st.one_of(
            slack_forms,
            damaged(json_bytes(st.just(SLACK_DM))),
            st.binary(max_size=200),
            st.sampled_from(HOSTILE_JSON),
        ),
        content_type=slack_content_types,
        signing=st.just("valid"),
    ),
    st.builds(
        SlackRequest,
        body=json_bytes(slack_envelopes),
        content_type=slack_content_types,
        signing=st.sampled_from(
            [
                "unsigned",
                "wrong secret",
                "stale",
                "future",
                "not a number",
                "garbled",
                "other body",
                "no timestamp",
            ]
        ),
    ),
)

# Where Slack puts ids that bolt reads as "an id, or an object with an id".
_SLACK_ID_FIELDS = ("enterprise", "team", "user", "channel")


def slack_known_bug(raw: bytes, content_type: str) -> str | None:
    """The known bug class a Slack body with a fresh timestamp belongs to, if any."""
    try:
        raw.decode()
    except UnicodeDecodeError:
        return "slack-non-utf8-body"
    try:
        body = parse_body(raw.decode(), content_type or None)
    except RecursionError:
        return "json-nesting"
    except (ValueError, UnicodeDecodeError):
        return None  # refused with 400 before bolt sees it
    if not isinstance(body, dict):
        return "slack-non-object"
    if _slack_malformed(body):
        return "slack-malformed-envelope"
    event = body.get("event")
    if isinstance(event, dict) and (
        _out_of_range(event.get("ts"))
        or any(
            isinstance(item, dict) and _out_of_range(item.get("ts"))
            for item in event.get("attachments") or ()
        )
    ):
        return "slack-timestamp-range"
    if has_surrogate(body):
        return "surrogates"
    return None


def _slack_malformed(body: dict[str, Any]) -> bool:
    """Whether a field bolt or parse_slack_event reads has a type Slack never sends."""
    if "event" in body and not isinstance(body["event"], dict):
        return True
    event = body.get("event") or {}
    if event.get("type") is not None and not isinstance(event["type"], str):
        return True  # bolt's event matcher runs a regex on it
    authorizations = body.get("authorizations")
    if authorizations is not None and not (
        isinstance(authorizations, list) and all(isinstance(a, dict) for a in authorizations)
    ):
        return True
    for container in (body, event, *(authorizations or ())):
        for key in _SLACK_ID_FIELDS:
            if container.get(key) is not None and not isinstance(container[key], str | dict):
                return True
        if container.get("response_urls") is not None and not isinstance(
            container["response_urls"], list
        ):
            return True
    for key in ("files", "attachments"):
        items = event.get(key)
        if items and not isinstance(items, list | str | dict):  # iterable ones do no harm
            return True
    for item in event.get("files") or ():
        if isinstance(item, dict) and not _number_like(item.get("size")):
            return True
    return False


def _number_like(value: object) -> bool:
    if not value:
        return True
    try:
        int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _out_of_range(ts: object) -> bool:
    try:
        datetime.fromtimestamp(float(str(ts)), UTC)
    except (OverflowError, OSError):
        return True
    except (TypeError, ValueError):
        return False
    return False


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


# --- Teams: POST /api/messages ----------------------------------------------------------------

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


# --- email: SMTP and parse_email ---------------------------------------------------------------

MAIL_SENDERS = [
    "Alice Example <alice@example.com>",
    "alice@example.com",
    "=?utf-8?q?Al=C3=AFce?= <alice@example.com>",
    '"Example, Alice" <alice@example.com>',
    "Bob <bob@example.org>",
    "<>",
    "not an address",
    "alice@example.com, bob@example.org",
    "a" * 300 + "@example.com",
    "=?x-unknown?b?????=",
    "Alice <alice@@example..com>",
    "(((((((((((((((((((((comment",
    "Alice \udcff <alice@example.com>",
]
CHARSETS = [
    "utf-8",
    "us-ascii",
    "iso-8859-1",
    "windows-1252",
    "koi8-r",
    "utf-16",
    "utf-7",
    "shift_jis",
    "x-unknown-charset",
    "",
    'utf-8"; name="x',
]
TRANSFER_ENCODINGS = ["7bit", "8bit", "binary", "quoted-printable", "base64", "x-uuencode", "bogus"]
mail_texts = st.one_of(
    nasty_text,
    st.text(max_size=300),
    st.sampled_from(
        [
            GMAIL_FORWARD,
            OUTLOOK_FORWARD,
            "Thanks!\n\nOn Mon, 3 Feb 2025, Bob wrote:\n> the budget\n> is 10k\n",
            "-----Original Message-----\nFrom: Bob\nSent: today\nSubject: x\n\nold text",
            " " * 5_000,
            "\n" * 2_000,
            "a" * 5_000,
            ">" * 3_000,
            "word " * 3_000,
        ]
    ),
)
header_values = st.one_of(
    nasty_text,
    st.sampled_from(
        [
            "=?utf-8?b?w6k=?=",
            "=?utf-8?q?broken",
            "=?koi8-r?b?8NLJ18XU?=",
            "<id@example.com>",
            "<" * 200,
            "<a@b> <c@d> " * 200,
            "x\r\nBcc: evil@example.org",
            "Mon, 99 Foo 99999 99:99:99 +9999",
            "Sat, 01 Mar 2025 10:00:00 +0000",
            "auto-replied",
            "bulk",
        ]
    ),
)


def _leaf(content_type: str, charset: str, encoding: str, payload: bytes) -> bytes:
    if encoding == "base64":
        body = base64.encodebytes(payload)
    elif encoding == "quoted-printable":
        body = quopri.encodestring(payload)
    else:
        body = payload
    head = f'Content-Type: {content_type}; charset="{charset}"\r\n'
    head += f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    return head.encode("utf-8", "surrogateescape") + body


def _encode(text: str, charset: str, lie: bool) -> bytes:
    """`text` in `charset`, or (when the mail lies about its charset) in UTF-8."""
    if not lie:
        with contextlib.suppress(LookupError, UnicodeError):
            return text.encode(charset or "ascii")
    return text.encode("utf-8", "surrogatepass")


@st.composite
def mime_entities(draw: st.DrawFn, depth: int = 0) -> bytes:
    """A MIME entity (its content headers and body): plain, HTML, alternative, attachments,
    an attached message (nested up to two levels), or empty."""
    kinds = ["plain", "html", "empty", "alternative", "mixed", "attached"]
    kind = draw(st.sampled_from(kinds if depth < 2 else kinds[:3]))
    charset = draw(st.sampled_from(CHARSETS))
    encoding = draw(st.sampled_from(TRANSFER_ENCODINGS))
    text = draw(mail_texts)
    lie = draw(st.booleans())
    if kind == "plain":
        return _leaf("text/plain", charset, encoding, _encode(text, charset, lie))
    if kind == "html":
        markup = f"<html><body><p>{html.escape(text)}</p><blockquote>old</blockquote></body>"
        return _leaf("text/html", charset, encoding, _encode(markup, charset, lie))
    if kind == "empty":
        return b"Content-Type: text/plain\r\n\r\n"
    if kind == "alternative":
        parts = [draw(mime_entities(depth=2)), draw(mime_entities(depth=2))]
        return _multipart("alternative", draw(boundaries), parts)
    if kind == "mixed":
        name = draw(st.one_of(nasty_text, st.just("report.pdf")))
        attachment = (
            f'Content-Type: application/octet-stream; name="{name}"\r\n'
            f'Content-Disposition: attachment; filename="{name}"\r\n'
            "Content-Transfer-Encoding: base64\r\n\r\n"
        ).encode("utf-8", "surrogatepass") + base64.encodebytes(draw(st.binary(max_size=100)))
        parts = [draw(mime_entities(depth=depth + 1)), attachment]
        return _multipart("mixed", draw(boundaries), parts)
    inner = draw(raw_mails(depth=depth + 1))
    wrapped_encoding = draw(st.sampled_from(["", "base64", "quoted-printable", "7bit"]))
    if wrapped_encoding == "base64":
        inner = base64.encodebytes(inner)
    elif wrapped_encoding == "quoted-printable":
        inner = quopri.encodestring(inner)
    attached = b"Content-Type: message/rfc822\r\n"
    if wrapped_encoding:
        attached += f"Content-Transfer-Encoding: {wrapped_encoding}\r\n".encode()
    attached += b"\r\n" + inner
    return _multipart(
        "mixed", draw(boundaries), [_leaf("text/plain", "utf-8", "7bit", b"fyi"), attached]
    )


boundaries = st.sampled_from(["b1", "=_part_0_=", "a" * 70, "x y", "", '"', "b1--"])


def _multipart(subtype: str, boundary: str, parts: list[bytes]) -> bytes:
    mark = boundary.encode()
    body = b"This is a multi-part message.\r\n"
    for part in parts:
        body += b"--" + mark + b"\r\n" + part + b"\r\n"
    body += b"--" + mark + b"--\r\n"
    head = f'Content-Type: multipart/{subtype}; boundary="{boundary}"\r\n\r\n'
    return head.encode() + body


@st.composite
def raw_mails(draw: st.DrawFn, depth: int = 0) -> bytes:
    """A whole mail: header block (From, To, Subject, ids, Date … some odd, some missing) and a
    MIME entity."""
    headers: list[tuple[str, str]] = []
    if draw(st.integers(min_value=0, max_value=9)):  # one in ten has no From
        headers.append(("From", draw(st.sampled_from([*MAIL_SENDERS[:4] * 3, *MAIL_SENDERS]))))
    headers.append(("To", ASSISTANT))
    optional = {
        "Subject": st.one_of(header_values, st.just("Fwd: Budget 2025")),
        "Message-ID": st.one_of(web_ids.map(lambda i: f"<{i}@fuzz.example>"), header_values),
        "In-Reply-To": header_values,
        "References": header_values,
        "Date": header_values,
        "MIME-Version": st.sampled_from(["1.0", "2.0", ""]),
    }
    for name, values in optional.items():
        if draw(st.booleans()):
            headers.append((name, draw(values)))
    if not draw(st.integers(min_value=0, max_value=5)):  # a bounce or an auto-reply: not answered
        headers.append(("Auto-Submitted", draw(st.sampled_from(["auto-replied", "no", "x"]))))
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return head.encode("utf-8", "surrogateescape") + draw(mime_entities(depth=depth))


@st.composite
def broken_mails(draw: st.DrawFn) -> bytes:
    """A mail after one to three blows: cut short, 8-bit junk, a huge or a thousand headers,
    bare LF line ends, the From line gone, a slice deleted (broken boundaries)."""
    data = draw(raw_mails())
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        at = draw(st.integers(min_value=0, max_value=len(data)))
        blow = draw(
            st.sampled_from(
                ["truncate", "junk", "huge header", "many headers", "bare lf", "no from", "cut"]
            )
        )
        if blow == "truncate":
            data = data[:at]
        elif blow == "junk":
            data = data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
        elif blow == "huge header":
            size = draw(st.sampled_from([998, 10_000, 20_000]))
            data = b"X-Huge: " + b"a" * size + b"\r\n" + data
        elif blow == "many headers":
            data = b"Received: from relay.example by mx.example\r\n" * 500 + data
        elif blow == "bare lf":
            data = data.replace(b"\r\n", b"\n")
        elif blow == "no from":
            data = re.sub(rb"(?im)^from:.*\r?\n", b"", data)
        else:
            data = data[:at] + data[at + draw(st.integers(min_value=1, max_value=40)) :]
    return data


any_mails = st.one_of(raw_mails(), broken_mails(), st.binary(max_size=300))


@dataclass(frozen=True)
class SmtpReply:
    code: int
    message: str


async def smtp_reply(port: int, data: bytes, mail_from: str) -> SmtpReply:
    """The reply that ends one delivery attempt of `data` (a refused MAIL or RCPT included)."""
    client = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, local_hostname="fuzz.example")
    try:
        async with asyncio.timeout(ANSWER_SECONDS):
            await client.connect()
            await client.mail(mail_from)
            await client.rcpt(ASSISTANT)
            response = await client.data(data)
    except aiosmtplib.SMTPResponseException as exc:
        return SmtpReply(exc.code, exc.message)
    except TimeoutError:
        raise AssertionError(f"no SMTP reply within {ANSWER_SECONDS} s: a hang") from None
    finally:
        if client.is_connected:
            with contextlib.suppress(aiosmtplib.SMTPException):
                await client.quit()
    return SmtpReply(response.code, response.message)


@pytest.fixture(scope="class")
def email(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("email")
    config = gateway_config(
        sqlite_url(folder),
        folder,
        identity={"users": [{"id": "alice", "org": "acme", "email": ["alice@example.com"]}]},
        channels={
            "email": {
                "enabled": True,
                "listen_port": free_port(),
                "addresses": [ASSISTANT],
                "auth": {"mode": "off"},  # DNS is out of reach in tests
                "outbound": {"host": "127.0.0.1", "port": free_port()},  # closed: fine
                "replies_per_sender_per_hour": 0,
            }
        },
    )
    with gateway_on(loop, config) as target:
        yield target


class TestEmailChannel:
    """The inbound SMTP server."""

    def test_every_mail_delivery_ends_with_an_smtp_reply_in_time(self, email: Target) -> None:
        port = email.gateway.runtime.config.channels.email.listen_port
        seen: Counter[str] = Counter()

        @settings(FUZZ, max_examples=250)
        @given(
            data=any_mails,
            mail_from=st.sampled_from(["alice@example.com", "alice@example.com", "bob@x.org", ""]),
        )
        def example(data: bytes, mail_from: str) -> None:
            reply = email.loop.run(smtp_reply(port, data, mail_from))
            seen["queued" if "queued" in reply.message else str(reply.code)] += 1
            assert reply.code == 250 or reply.code == 451 or 500 <= reply.code < 600, reply
            # The channel turns any exception into a 451: that is a crash all the same.
            assert "Internal error" not in reply.message, reply

        example()
        assert {"queued", "250", "550"} <= set(seen), seen
        email.assert_healthy()
        email.assert_no_failed_turns()


def test_parse_email_returns_a_message_or_a_payload_error_in_bounded_time() -> None:
    seen: Counter[str] = Counter()

    @settings(FUZZ, max_examples=600)
    @given(data=any_mails)
    def example(data: bytes) -> None:
        started = time.monotonic()
        try:
            outcome: ChannelMessage | str = parse_email(data)
        except ChannelPayloadError as exc:
            outcome = str(exc)  # the reason the SMTP reply will carry
        assert time.monotonic() - started < 3.0
        if isinstance(outcome, str):
            assert outcome.strip()
            seen["refused"] += 1
        else:
            assert isinstance(outcome, ChannelMessage)
            seen["forward" if outcome.forwarded else "message"] += 1

    example()
    assert {"refused", "message", "forward"} <= set(seen), seen


# --- config files -----------------------------------------------------------------------------

EXAMPLE_CONFIG = yaml.safe_load((REPO / "config" / "gateway.example.yaml").read_text())
DURATION_KEYS = {
    ("llm", "timeout"),
    ("llm", "offline_latency"),
    ("sessions", "archive_after"),
    ("sessions", "suggest_new_after"),
}
config_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(),
    st.text(max_size=20),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from(
        [
            # durations
            "0s",
            "-5m",
            "5x",
            "1h30",
            "24 h",
            "1e3",
            "P1D",
            "500ms",
            "1h30m",
            "9" * 30,
            "99999999999999999999d",
            10**17,
            1e308,
            # ports
            0,
            -1,
            65536,
            "8080",
            "http",
            3.5,
            # enums and other strings
            "JSON",
            "verbose",
            "on",
            "off",
            "s3 ",
            "aws:kms",
            "anthropic",
            "provision",
            "socket",
            "trusted_mta",
            "0.0.0.0",
            "mysql://root@db/x",
            "${FUZZ_UNSET_VARIABLE}",
            "${FUZZ_UNSET_VARIABLE:-fallback}",
            "${broken",
            "$${literal}",
            "not an id!",
            "T0001",
        ]
    ),
)
config_keys = st.one_of(
    st.sampled_from(sorted({str(p[-1]) for p in _paths(EXAMPLE_CONFIG) if p})),
    st.sampled_from(["archive_afterr", "prot", "unknown", "<<", "enabled ", "80", "on", "~"]),
    st.text(max_size=10),
)


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    """The example config with keys dropped, values of the wrong type, unknown keys, bad
    durations, ports and enums; then maybe textual damage (cut short, a stray line, a tab, a
    reference to an unset variable, a control character)."""
    data = draw(mutated(EXAMPLE_CONFIG, config_junk, config_keys))
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=draw(st.booleans()))
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        at = draw(st.integers(min_value=0, max_value=len(text)))
        damage = draw(
            st.sampled_from(["cut", "line", "tab", "reference", "control", "indent", "alias"])
        )
        if damage == "cut":
            text = text[:at]
        elif damage == "line":
            text = text[:at] + "\n" + draw(st.text(max_size=20)) + "\n" + text[at:]
        elif damage == "tab":
            text = text[:at] + "\t" + text[at:]
        elif damage == "reference":
            text = (
                text[:at] + "${FUZZ_UNSET_" + draw(st.sampled_from(["X}", "", "X:-y}"])) + text[at:]
            )
        elif damage == "control":
            text = text[:at] + draw(st.sampled_from(["\x00", "\x01", "\x7f", "\ufffe"])) + text[at:]
        elif damage == "indent":
            text = text.replace("\n  ", "\n   ", 1)
        else:
            text += "\nanchors: &a [x, y]\nagain: [*a, *a, *a]\n"
    return text


config_files = st.one_of(
    config_texts(),
    config_texts(),
    config_texts(),
    st.text(max_size=200),
    st.sampled_from(["", "---", "--- []", "null", "42", "- a\n- b", "{", "a: b: c", "? x"]),
)

_YAML_FORBIDDEN = re.compile(
    "[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)


def config_known_bug(text: str) -> str | None:
    """The known bug class a config text belongs to, if any."""
    if _YAML_FORBIDDEN.search(text):
        return "config-control-characters"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    except RecursionError:
        return "config-deep-nesting"
    sections = data if isinstance(data, dict) else {}
    for section, key in DURATION_KEYS:
        values = sections.get(section)
        if not isinstance(values, dict) or values.get(key) is None:
            continue
        try:
            parse_duration(values[key])
        except OverflowError:
            return "config-duration-overflow"
        except Exception:
            continue  # any other failure is an ordinary validation problem
    return None


def test_check_config_reports_problems_of_any_file_without_raising(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    seen: Counter[str] = Counter()

    @settings(FUZZ, max_examples=400)
    @given(text=config_files)
    def example(text: str) -> None:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        started = time.monotonic()
        try:
            problems = check_config(path, {})
        except Exception:
            if tolerated(config_known_bug(text)):
                seen[f"known bug {config_known_bug(text)}"] += 1
                return
            raise
        seen["valid" if not problems else "problems"] += 1
        assert time.monotonic() - started < 5.0
        for problem in problems:
            assert problem.file == str(path)
            assert problem.message.strip()
            assert str(problem).startswith(str(path))

    example()
    assert {"valid", "problems"} <= set(seen), seen


def test_config_check_command_exits_0_or_2_for_any_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gateway.yaml"
    codes: Counter[int] = Counter()

    @settings(FUZZ, max_examples=200)
    @given(text=config_files)
    def example(text: str) -> None:
        if tolerated(config_known_bug(text)):
            return
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        code = gateway_cli(["config", "check", str(path)])
        printed = capsys.readouterr()
        codes[code] += 1
        assert code in (0, 2), printed
        lines = printed.out.splitlines()
        assert lines, printed
        if code == 0:
            assert lines == ["ok"]
        else:
            assert all(line.strip() for line in lines), printed

    example()
    assert set(codes) == {0, 2}, codes


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "[" * 5_000 + "]" * 5_000, id="deep-flow", marks=known_bug("config-deep-nesting")
        ),
        pytest.param(
            "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 3_000)),
            id="deep-block",
            marks=known_bug("config-deep-nesting"),
        ),
        pytest.param(
            "sessions:\n  archive_after: 99999999999999999999d\n",
            id="duration-overflow",
            marks=known_bug("config-duration-overflow"),
        ),
        pytest.param(
            "llm:\n  timeout: 100000000000000000\n",
            id="duration-seconds-overflow",
            marks=known_bug("config-duration-overflow"),
        ),
        pytest.param(
            "server:\n  host: \x00\n",
            id="nul-character",
            marks=known_bug("config-control-characters"),
        ),
        pytest.param("server:\n  port: 99999\n", id="bad-port"),
    ],
)
def test_check_config_turns_hostile_files_into_problems(tmp_path: Path, text: str) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    problems = check_config(path, {})
    assert problems
    assert all(str(problem).startswith(str(path)) for problem in problems)


def _alias_bomb(levels: int) -> str:
    lines = ['l0: &l0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "levels",
    [pytest.param(2, id="2-levels"), pytest.param(7, marks=known_bug("config-alias-bomb"))],
)
def test_check_config_of_an_alias_bomb_finishes_quickly(tmp_path: Path, levels: int) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(levels))  # 9**levels references in a few hundred bytes
    script = "import sys; from gateway.config import check_config; check_config(sys.argv[1], {})"
    try:
        subprocess.run([sys.executable, "-c", script, str(path)], cwd=REPO, timeout=3, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"check_config of a {len(path.read_text())}-byte file took over 3 s")
