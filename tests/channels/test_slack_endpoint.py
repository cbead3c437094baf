"""Slack's request signature, checked once on the bytes received (`signature_problem`)."""

from __future__ import annotations

import pytest

from channels.slack.endpoint import REPLAY_WINDOW_SECONDS, signature_problem
from tests.fakes.slack_api import SIGNING_SECRET, sign

NOW = 1_700_000_000


def headers(body: bytes, **changes: str) -> dict[str, str]:
    signed = {name.lower(): value for name, value in sign(body, timestamp=NOW).items()}
    return {**signed, **changes}


@pytest.mark.parametrize("body", [b'{"type": "event_callback"}', b"\xff\xfe{}", b""])
def test_a_body_signed_with_the_secret_passes_whatever_its_encoding(body: bytes) -> None:
    assert signature_problem(SIGNING_SECRET, body, headers(body), now=NOW) is None


@pytest.mark.parametrize("body", [b"{}", b"\xff\xfe{}"])
def test_a_body_signed_with_another_secret_is_refused(body: bytes) -> None:
    forged = {name.lower(): value for name, value in sign(body, secret="x", timestamp=NOW).items()}
    assert signature_problem(SIGNING_SECRET, body, forged, now=NOW) == "invalid signature"


def test_a_signature_over_another_body_is_refused() -> None:
    assert signature_problem(SIGNING_SECRET, b"{} ", headers(b"{}"), now=NOW) == (
        "invalid signature"
    )


def test_a_signature_with_characters_outside_ascii_is_refused_not_an_error() -> None:
    garbled = headers(b"{}", **{"x-slack-signature": "v0=é"})
    assert signature_problem(SIGNING_SECRET, b"{}", garbled, now=NOW) == "invalid signature"


def test_missing_headers_are_named() -> None:
    assert signature_problem(SIGNING_SECRET, b"{}", {}, now=NOW) == (
        "missing X-Slack-Signature or X-Slack-Request-Timestamp"
    )


@pytest.mark.parametrize("timestamp", ["12ab", "-1", "²", " 1700000000"])
def test_a_timestamp_that_is_not_ascii_digits_is_not_a_number(timestamp: str) -> None:
    stamped = headers(b"{}", **{"x-slack-request-timestamp": timestamp})
    assert signature_problem(SIGNING_SECRET, b"{}", stamped, now=NOW) == (
        "X-Slack-Request-Timestamp is not a number"
    )


@pytest.mark.parametrize(
    "timestamp",
    [
        str(NOW + REPLAY_WINDOW_SECONDS + 1),
        str(NOW - REPLAY_WINDOW_SECONDS - 1),
        "9" * 5000,  # more digits than `int` reads from a string: still only stale
    ],
)
def test_a_timestamp_outside_the_replay_window_is_stale(timestamp: str) -> None:
    stamped = headers(b"{}", **{"x-slack-request-timestamp": timestamp})
    assert signature_problem(SIGNING_SECRET, b"{}", stamped, now=NOW) == (
        "stale X-Slack-Request-Timestamp (more than 5 minutes off)"
    )


def test_a_timestamp_inside_the_replay_window_passes() -> None:
    body = b"{}"
    late = {name.lower(): value for name, value in sign(body, timestamp=NOW - 299).items()}
    assert signature_problem(SIGNING_SECRET, body, late, now=NOW) is None
