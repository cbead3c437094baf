"""What the Slack fuzz tests send to POST /slack/events: envelopes, shortcuts and forms, signed
well or badly (`SlackRequest`), and the known-bug class a signed body belongs to
(`slack_known_bug`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st
from slack_bolt.request.internals import parse_body

from tests.fakes.slack_api import (
    BOT_USER,
    TEAM,
    direct_message,
    event_envelope,
    sign,
)
from tests.reliability.fuzz.harness import (
    has_surrogate,
)
from tests.reliability.fuzz.strategies import (
    HOSTILE_JSON,
    damaged,
    huge_text,
    json_bytes,
    json_values,
    mutated,
    nasty_text,
    with_surrogate,
)

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
