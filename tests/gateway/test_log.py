"""Structured logging: JSON lines, context binding and secret redaction."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from gateway.log import (
    REDACTED,
    bind_turn_context,
    clear_turn_context,
    configure_logging,
    get_logger,
)


@pytest.fixture(autouse=True)
def json_logging(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    # Depends on capsys so the handler writes to the captured stderr.
    del capsys
    configure_logging("json", "debug")
    yield
    clear_turn_context()
    structlog.reset_defaults()
    logging.getLogger().handlers.clear()


def lines(captured: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in captured.splitlines() if line.strip()]


def test_events_are_json_lines_with_bound_turn_context(capsys: pytest.CaptureFixture[str]) -> None:
    bind_turn_context(session_id="s1", user_id="alice", channel="slack")
    get_logger("test").info("session.compacted", messages=12)
    clear_turn_context()
    get_logger("test").info("after.turn")
    first, second = lines(capsys.readouterr().err)
    assert first["event"] == "session.compacted"
    assert (first["session_id"], first["user_id"], first["channel"]) == ("s1", "alice", "slack")
    assert first["messages"] == 12
    assert first["level"] == "info"
    assert first["logger"] == "test"
    assert "timestamp" in first
    assert "session_id" not in second


def test_secret_keys_are_redacted_at_any_depth(capsys: pytest.CaptureFixture[str]) -> None:
    get_logger("test").info(
        "request.received",
        headers={"Authorization": "Bearer abc.def.ghi", "X-Slack-Signature": "v0=1"},
        config={"slack": {"bot_token": "whatever", "signing_secret": "s3"}},
        password="hunter2",
        api_key="k",
        tokens=512,
        input_tokens=10,
    )
    (event,) = lines(capsys.readouterr().err)
    assert event["headers"] == {"Authorization": REDACTED, "X-Slack-Signature": "v0=1"}
    assert event["config"] == {"slack": {"bot_token": REDACTED, "signing_secret": REDACTED}}
    assert event["password"] == REDACTED
    assert event["api_key"] == REDACTED
    assert (event["tokens"], event["input_tokens"]) == (512, 10)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("posting with xoxb-1234-5678-abcdef failed", "xoxb-1234-5678-abcdef"),
        ("app token xapp-1-A0-123-abc", "xapp-1-A0-123-abc"),
        ("key sk-ant-api03-AbC_dEf-123 rejected", "sk-ant-api03-AbC_dEf-123"),
        ("header was Bearer eyJhbGciOiJSUzI1NiJ9.x.y", "eyJhbGciOiJSUzI1NiJ9.x.y"),
        ("connect postgresql://gw:pa55word@db/gw failed", "pa55word"),
        ("aws key AKIAIOSFODNN7EXAMPLE used", "AKIAIOSFODNN7EXAMPLE"),
    ],
)
def test_secret_looking_text_is_redacted_in_any_value(
    capsys: pytest.CaptureFixture[str], text: str, secret: str
) -> None:
    get_logger("test").warning("delivery.failed", error=text, details=[text])
    captured = capsys.readouterr().err
    assert secret not in captured
    assert REDACTED in lines(captured)[0]["error"]  # type: ignore[operator]


def test_standard_library_records_get_the_same_format_and_redaction(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logging.getLogger("botocore").warning("retrying with xoxb-1-2-3")
    (event,) = lines(capsys.readouterr().err)
    assert event["logger"] == "botocore"
    assert event["event"] == f"retrying with {REDACTED}"


def test_a_traceback_is_redacted_like_any_text(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        raise ConnectionError("connect postgresql://gw:pa55word@db/gw failed")
    except ConnectionError:
        get_logger("test").exception("database.unreachable")
        logging.getLogger("sqlalchemy.pool").exception("pool.failed")
    captured = capsys.readouterr().err
    assert "pa55word" not in captured
    ours, library = lines(captured)
    assert ours["level"] == library["level"] == "error"
    for event in (ours, library):
        assert "ConnectionError: connect postgresql://" in event["exception"]  # type: ignore[operator]
        assert REDACTED in event["exception"]  # type: ignore[operator]


def test_the_model_clients_request_lines_show_at_debug_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    request = "HTTP Request: POST https://api.anthropic.com/v1/messages"
    logging.getLogger("httpx2").info(request)
    configure_logging("json", "info")
    logging.getLogger("httpx2").info(request)
    logging.getLogger("httpx").info(request)
    logging.getLogger("httpx2").warning("retrying")
    assert [line["event"] for line in lines(capsys.readouterr().err)] == [request, "retrying"]


def test_a_line_below_the_level_is_dropped_before_it_is_processed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    processed: list[str] = []

    def counting_redaction(logger: object, method: str, event: dict[str, object]) -> object:
        processed.append(str(event["event"]))
        return event

    monkeypatch.setattr("gateway.log.redact_secrets", counting_redaction)
    configure_logging("json", "warning")
    log = get_logger("test.levels")
    log.info("turn.started")
    log.debug("turn.detail")
    log.warning("turn.slow")
    log.error("turn.failed")
    assert processed == ["turn.slow", "turn.failed"]
    assert [line["event"] for line in lines(capsys.readouterr().err)] == [
        "turn.slow",
        "turn.failed",
    ]
