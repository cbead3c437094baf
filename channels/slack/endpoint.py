"""The HTTP side of `POST /slack/events`: what a request must pass before slack-bolt sees it,
and bolt's answer as a Starlette response.

A request is checked here once, in this order: its size (413), Slack's signature within the
replay window (401, the reason says what is wrong), then a body that parses as JSON or form
data of the shapes bolt relies on (400). bolt's own signature check is off (the adapter builds
its `AsyncApp` with `request_verification_enabled=False`): by the time bolt is called, the
request is known to come from Slack. Socket Mode has no endpoint and no signature.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

import structlog
from slack_bolt.adapter.starlette.async_handler import to_starlette_response
from slack_bolt.async_app import AsyncApp, AsyncBoltRequest
from slack_bolt.request.internals import parse_body
from starlette.requests import Request
from starlette.responses import Response

from errors import ChannelPayloadError, RejectedRequestError

log = structlog.stdlib.get_logger(__name__)

MAX_BODY_BYTES = 1_048_576
REPLAY_WINDOW_SECONDS = 300
# More digits than any time Slack could stamp (and fewer than `int` refuses to read).
_MAX_TIMESTAMP_DIGITS = 15


async def verified_body(request: Request, signing_secret: str) -> str:
    """The text of a request Slack signed, once it passed every check.

    Raises `RejectedRequestError` (413 too large, 401 not signed by Slack) or
    `ChannelPayloadError` (not JSON or form data, or not of the shapes bolt relies on).
    """
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise RejectedRequestError(413, "the request body is too large")
    reason = signature_problem(signing_secret, body, request.headers, now=time.time())
    if reason is not None:
        raise RejectedRequestError(401, reason)
    try:
        text = body.decode()
        parsed = parse_body(text, request.headers.get("content-type"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ChannelPayloadError(f"the body is not valid JSON or form data: {reason}") from exc
    problem = shape_problem(parsed)
    if problem is not None:
        raise ChannelPayloadError(problem)
    return text


def signature_problem(
    signing_secret: str, body: bytes, headers: Mapping[str, str], *, now: float
) -> str | None:
    """Why `body` was not signed by Slack with `signing_secret` at most
    `REPLAY_WINDOW_SECONDS` from `now` (None when it was).

    Slack signs `v0:{timestamp}:{body}` with HMAC-SHA256. The digest is taken over the bytes
    received, whatever their encoding: a forged body that is not UTF-8 is then refused as
    unsigned (401), and a signed one as malformed (400) when it is parsed.
    """
    timestamp = headers.get("x-slack-request-timestamp", "")
    signature = headers.get("x-slack-signature", "")
    if not timestamp or not signature:
        return "missing X-Slack-Signature or X-Slack-Request-Timestamp"
    if not (timestamp.isascii() and timestamp.isdigit()):
        return "X-Slack-Request-Timestamp is not a number"
    if len(timestamp) > _MAX_TIMESTAMP_DIGITS or abs(now - int(timestamp)) > REPLAY_WINDOW_SECONDS:
        return "stale X-Slack-Request-Timestamp (more than 5 minutes off)"
    signed = b"v0:" + timestamp.encode() + b":" + body
    digest = hmac.new(signing_secret.encode(), signed, hashlib.sha256).hexdigest()
    # Compared as bytes: `compare_digest` refuses strings with characters outside ASCII.
    if not hmac.compare_digest(f"v0={digest}".encode(), signature.encode("utf-8", "replace")):
        return "invalid signature"
    return None


async def bolt_response(app: AsyncApp, text: str, headers: Mapping[str, str]) -> Response:
    """Hand a verified request to bolt; its answer as a Starlette response."""
    answer = await app.async_dispatch(AsyncBoltRequest(body=text, headers=dict(headers)))
    if answer.status == 404:
        # A request type nobody listens for: Slack must not retry it.
        log.debug("slack.request_ignored", reason="no listener")
        return Response(status_code=200)
    return to_starlette_response(answer)


# Fields of an envelope or interactivity payload and the shapes slack-bolt relies on.
_SHAPES: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("type", (str,)),
    ("team_id", (str,)),
    ("event_id", (str,)),
    ("api_app_id", (str,)),
    ("event", (dict,)),
    ("authorizations", (list,)),
    ("team", (dict, str)),
    ("user", (dict, str)),
    ("channel", (dict, str)),
    ("enterprise", (dict, str)),
    ("message", (dict,)),
)


def shape_problem(body: object) -> str | None:
    """Why a parsed request cannot be a Slack event or interaction (None when it can be).

    Checked before slack-bolt sees it: bolt assumes these shapes and fails with a 500 on others.
    """
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    for name, shapes in _SHAPES:
        value = body.get(name)
        if value is not None and not isinstance(value, shapes):
            return f"'{name}' has the wrong type"
    if "event" in body and not isinstance(body["event"], dict):
        return "'event' must be an object"
    event = body.get("event")
    if isinstance(event, dict):
        if not isinstance(event.get("type"), str):
            return "'event.type' must be a string"
        fields = ("user", "channel", "subtype", "ts", "thread_ts", "bot_id", "text")
        # Other event types (channel_created …) use these names for objects; they are ignored.
        for name in fields if event["type"] in ("message", "app_mention") else ():
            value = event.get(name)
            if value is not None and not isinstance(value, str):
                return f"'event.{name}' must be a string"
    if not all(isinstance(item, dict) for item in body.get("authorizations") or ()):
        return "'authorizations' must be a list of objects"
    return None
