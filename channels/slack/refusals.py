"""Slack's refusals as `DeliveryError`s: which answers trying again can fix (rate limits with
Slack's `Retry-After`, server errors, an unreachable Slack) and which it cannot."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError

from errors import DeliveryError

# Slack's answers that trying again cannot fix.
PERMANENT_ERRORS = frozenset(
    {
        "account_inactive",
        "channel_not_found",
        "invalid_auth",
        "is_archived",
        "missing_scope",
        "msg_too_long",
        "no_permission",
        "no_text",
        "not_authed",
        "not_in_channel",
        "restricted_action",
        "token_revoked",
        "user_not_found",
    }
)


async def slack_call(call: Awaitable[Any]) -> Any:
    """One Web API call, its failures as `DeliveryError`s (`delivery_error`)."""
    try:
        return await call
    except SlackApiError as exc:
        raise delivery_error(exc) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DeliveryError(f"Slack unreachable: {exc or type(exc).__name__}") from exc


def error_code(exc: SlackApiError) -> str:
    """The `error` of Slack's answer (`invalid_auth` …), empty when it has none."""
    data = exc.response.data if exc.response is not None else None
    return str(data.get("error", "")) if isinstance(data, Mapping) else ""


def is_transient(exc: SlackApiError) -> bool:
    """A rate limit or a server error: the same call may succeed later."""
    status = exc.response.status_code if exc.response is not None else 0
    return status == 429 or status >= 500 or error_code(exc) in ("ratelimited", "")


def delivery_error(exc: SlackApiError) -> DeliveryError:
    """A refused Web API call as a `DeliveryError`: rate limits with Slack's `Retry-After`,
    the codes in `PERMANENT_ERRORS` permanent, anything else worth another try."""
    status = exc.response.status_code if exc.response is not None else 0
    code = error_code(exc) or f"HTTP {status}"
    if status == 429 or code == "ratelimited":
        headers = exc.response.headers if exc.response is not None else {}
        return DeliveryError(f"Slack rate limit ({code})", retry_after=retry_after(headers))
    return DeliveryError(f"Slack refused the message: {code}", permanent=code in PERMANENT_ERRORS)


def retry_after(headers: Mapping[str, Any]) -> float:
    """Seconds Slack asks to wait (`Retry-After`, whatever its case); 1 when it does not say."""
    for name, value in headers.items():
        if name.lower() == "retry-after":
            raw = value[0] if isinstance(value, list | tuple) else value
            try:
                return max(float(raw), 0.0)
            except (TypeError, ValueError):
                break
    return 1.0
