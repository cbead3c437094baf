"""Structured logging: JSON lines in production, readable console output in development.

Every log line passes through `redact_secrets`, which hides values under secret-looking keys
(tokens, passwords, API keys, Authorization headers) and secret-looking substrings inside any
string (Slack tokens, Anthropic keys, bearer credentials, passwords in URLs), wherever they
appear in the event, including nested dicts and lists, tracebacks included (JSON).

The gateway's own events go from structlog straight to stderr; the standard library's
records (uvicorn, botocore, SQLAlchemy) through a `logging` handler with the same processors.
A line at info costs about 30-40 µs of CPU, one below the level about 3 (`bench/log_lines.py`).
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

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
    re.compile(r"\b(?i:bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"),  # HTTP credentials
    re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"),  # user:password@ in URLs
)
# A literal that each of them needs: one search of these passes over the text (nearly every
# one) that can hold none, in a quarter of the time of the patterns themselves.
SECRET_VALUE_HINT = re.compile(r"xox|xapp-|sk-ant-|AKIA|ASIA|(?i:bearer|basic)|://")


def _redact_text(text: str) -> str:
    if SECRET_VALUE_HINT.search(text) is None:
        return text
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


@functools.lru_cache(maxsize=1024)
def _secret_key(key: str) -> bool:
    # Log lines use few distinct keys: each is matched once.
    return key.lower() not in NON_SECRET_KEYS and SECRET_KEY_PATTERN.search(key) is not None


def _redact_item(key: object, value: Any) -> Any:
    if (
        isinstance(key, str)
        and _secret_key(key)
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


class _StderrLines:
    """The gateway's own events, rendered by structlog, each a line on the current stderr.

    They skip the standard library's records (two `LogRecord`s and a caller lookup a line)
    and take the handler's lock, so that no line interleaves with a library's record."""

    def __init__(self, name: str, lock: threading.RLock) -> None:
        self.name = name  # `add_logger_name` reads it
        self._lock = lock

    def msg(self, line: str) -> None:
        """Write one rendered line."""
        with self._lock:
            stream = sys.stderr
            stream.write(line + "\n")
            stream.flush()

    debug = info = warning = warn = error = err = critical = fatal = exception = msg


def configure_logging(log_format: LogFormat = "json", level: str = "info") -> None:
    """Route structlog and the standard library's logging to stderr in one format.

    Libraries that log with `logging` (uvicorn, SQLAlchemy, botocore) get the same format and
    redaction as the gateway's own events. The gateway's own lines below `level` are dropped
    by the first processor; the others are rendered by structlog and written directly.
    """
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: Processor
    if log_format == "console":
        # Renders exceptions itself (a development format).
        redacted: list[Processor] = [redact_secrets]
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        # A traceback is text like any other: redacted after it is formatted.
        redacted = [structlog.processors.format_exc_info, redact_secrets]
        renderer = structlog.processors.JSONRenderer()

    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                *shared,
                structlog.stdlib.ExtraAdder(),
                _drop_color_message,
                *redacted,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    lock = handler.lock
    assert lock is not None  # `Handler.__init__` created it
    structlog.configure(
        # A line below the level is dropped first: not time-stamped, redacted and rendered.
        # A processor, not a filtering logger: `structlog.testing.capture_logs` replaces the
        # processors of loggers already in use, and sees every level.
        processors=[_below(logging.getLevelName(level.upper())), *shared, *redacted, renderer],
        logger_factory=functools.partial(_stderr_lines, lock=lock),
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=True,
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
    # The model's HTTP client logs each request at INFO (the turn's lines say what it did):
    # shown at debug only.
    requests = logging.NOTSET if level.lower() == "debug" else logging.WARNING
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(requests)


def _below(level: int) -> Processor:
    """A processor dropping the events of methods below `level` (a logger's `exception`
    passes as `error`)."""

    def drop_below(_logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
        if structlog.processors.NAME_TO_LEVEL.get(method, logging.INFO) < level:
            raise structlog.DropEvent
        return event_dict

    return drop_below


def _stderr_lines(name: str = "root", *_args: Any, lock: threading.RLock) -> _StderrLines:
    """structlog's logger factory: `get_logger(name)` passes the module's name."""
    return _StderrLines(name, lock)


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


def get_logger(name: str) -> FilteringBoundLogger:
    """A structured logger named after its module."""
    logger: FilteringBoundLogger = structlog.get_logger(name)
    return logger
