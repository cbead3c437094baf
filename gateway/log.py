"""Structured logging: JSON lines in production, readable console output in development.

Every log line passes through `redact_secrets`, which hides values under secret-looking keys
(tokens, passwords, API keys, Authorization headers) and secret-looking substrings inside any
string (Slack tokens, Anthropic keys, bearer credentials, passwords in URLs), wherever they
appear in the event, including nested dicts and lists.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

REDACTED = "[REDACTED]"

# Keys whose values are secrets whatever they look like.
SECRET_KEY_PATTERN = re.compile(
    r"(pass(word|wd)?|secret|token|api[_-]?key|authorization|cookie|credential|private[_-]?key)",
    re.IGNORECASE,
)
# Keys that contain a secret word but hold no secret (counters and references).
NON_SECRET_KEYS = frozenset(
    {"tokens", "input_tokens", "output_tokens", "tokens_before", "tokens_after", "max_tokens"}
)
# Secret-looking substrings inside free text.
SECRET_VALUE_PATTERNS = (
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]+"),  # Slack bot/user/app tokens
    re.compile(r"\bxapp-[A-Za-z0-9-]+"),  # Slack app-level tokens
    re.compile(r"\bsk-ant-[A-Za-z0-9_-]+"),  # Anthropic API keys
    re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"),  # AWS access key ids
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"),  # HTTP credentials
    re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"),  # user:password@ in URLs
)


def _redact_text(text: str) -> str:
    for pattern in SECRET_VALUE_PATTERNS:
        text = pattern.sub(REDACTED, text)
    return text


def _redact(value: Any) -> Any:
    if isinstance(value, str):
        return _redact_text(value)
    if isinstance(value, Mapping):
        return {key: _redact_item(key, item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(item) for item in value]
    return value


def _redact_item(key: object, value: Any) -> Any:
    if (
        isinstance(key, str)
        and key.lower() not in NON_SECRET_KEYS
        and SECRET_KEY_PATTERN.search(key)
        and value not in (None, "", 0)
        and not isinstance(value, bool | int)
    ):
        return REDACTED
    return _redact(value)


def _drop_color_message(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    # uvicorn attaches an ANSI-coloured copy of each message as an "extra"; it is noise.
    event_dict.pop("color_message", None)
    return event_dict


def redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor that removes secrets from every key and value of the event."""
    return {key: _redact_item(key, value) for key, value in event_dict.items()}


LogFormat = Literal["json", "console"]


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the moment of each record, not at set-up."""

    def emit(self, record: logging.LogRecord) -> None:
        """Write one formatted record to the current stderr."""
        self.stream = sys.stderr
        super().emit(record)


def configure_logging(log_format: LogFormat = "json", level: str = "info") -> None:
    """Route structlog and the standard library's logging through one pipeline.

    Libraries that log with `logging` (uvicorn, SQLAlchemy, botocore) get the same format and
    redaction as the gateway's own events.
    """
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.stdlib.ExtraAdder(),
        _drop_color_message,
        redact_secrets,
    ]
    renderer: Processor
    if log_format == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer()

    structlog.configure(
        # A line below the level is dropped first: not time-stamped, redacted and rendered
        # for the standard library to drop (a turn logs a few lines at info).
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn installs its own handlers; let its records flow to ours instead.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    # Alembic narrates every migration step at INFO; `storage.migrated` says what matters.
    logging.getLogger("alembic").setLevel(logging.WARNING)


def bind_turn_context(
    *, session_id: str | None = None, user_id: str | None = None, channel: str | None = None
) -> None:
    """Bind the turn's identifiers once; every log line of the turn then carries them."""
    values: MutableMapping[str, str] = {}
    if session_id is not None:
        values["session_id"] = session_id
    if user_id is not None:
        values["user_id"] = user_id
    if channel is not None:
        values["channel"] = channel
    structlog.contextvars.bind_contextvars(**values)


def clear_turn_context() -> None:
    """Forget the identifiers bound by `bind_turn_context`."""
    structlog.contextvars.unbind_contextvars("session_id", "user_id", "channel")


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structured logger named after its module."""
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name)
    return logger
