"""The value types of the configuration schema: durations, identifiers, addresses, secrets,
ports, the strict base model, and the located errors of cross-field rules.

`gateway.settings` builds the sections from these; see its docstring for the conventions
that keep an error located at the key that is wrong.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from datetime import timedelta
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

RULE_ERROR_TYPE = "config_rule"
"""The pydantic error type of every rule in this module (a readable message, no prefix)."""

Loc = tuple[str | int, ...]


def rule_error(message: str) -> PydanticCustomError:
    """A validation error whose message is shown as is (no "Value error, " prefix)."""
    return PydanticCustomError(RULE_ERROR_TYPE, message)


def located_errors(title: str, errors: Iterable[tuple[Loc, str, object]]) -> ValidationError:
    """Bundle ``(location, message, input)`` triples into one `ValidationError`.

    Raised from a field validator, the locations are relative to that field, so a rule on a
    list can point at ``users[3].id`` and report every offending item at once.
    """
    details = [
        InitErrorDetails(type=rule_error(message), loc=loc, input=value)
        for loc, message, value in errors
    ]
    return ValidationError.from_exception_data(title, details)


# --- value types ---------------------------------------------------------------------------

_DURATION_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
}
# "ms" is listed before "m" and "s" so that "500ms" is not read as 500 minutes and an "s".
_DURATION_PART = r"(\d+(?:\.\d+)?)(ms|s|m|h|d)"
_DURATION_RE = re.compile(rf"(?:{_DURATION_PART})+")
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")


def parse_duration(value: object) -> timedelta:
    """Read a duration: ``"24h"``, ``"30m"``, ``"90s"``, ``"7d"``, ``"1h30m"``, ``"500ms"``.

    A plain number (or a numeric string) counts as seconds; a `timedelta` passes through. The
    result must be greater than zero. Anything else raises a pydantic error that says what a
    valid duration looks like.
    """
    try:
        if isinstance(value, timedelta):
            result = value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            result = timedelta(seconds=value)
        elif isinstance(value, str) and _NUMBER_RE.fullmatch(value.strip()):
            result = timedelta(seconds=float(value.strip()))
        elif isinstance(value, str) and _DURATION_RE.fullmatch(value.strip()):
            parts = re.findall(_DURATION_PART, value.strip())
            result = sum(
                (float(amount) * _DURATION_UNITS[unit] for amount, unit in parts), timedelta()
            )
        else:
            raise rule_error(
                f"invalid duration {value!r}: use a number with s, m, h or d, e.g. 30m",
            )
    except OverflowError as exc:
        raise rule_error(f"invalid duration: {str(value)[:40]!r} is too long") from exc
    if result <= timedelta():
        raise rule_error(f"invalid duration {value!r}: must be greater than zero")
    return result


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
"""A `timedelta` written as ``"24h"``, ``"1h30m"``, ``"500ms"`` or a number of seconds."""


def empty_to_none(value: object) -> object:
    """Treat ``""`` as "not set", so ``${VAR:-}`` can leave an optional key unset."""
    return None if value == "" else value


OptionalStr = Annotated[str | None, BeforeValidator(empty_to_none)]
"""An optional string where an empty string means "not set"."""

_IDENTIFIER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _check_identifier(value: str) -> str:
    """Ids become path segments in the transcript store, so they must be path-safe."""
    if not _IDENTIFIER_RE.fullmatch(value):
        raise rule_error(
            f"invalid id {value!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
        )
    return value


Identifier = Annotated[str, AfterValidator(_check_identifier)]
"""An organization or user id: safe to use as a path segment and in URLs."""

_SLACK_IDENTITY_RE = re.compile(r"[A-Za-z0-9]+:[A-Za-z0-9]+")


def _check_slack_identity(value: str) -> str:
    """A Slack user is only unique within its workspace, so both ids are required."""
    if not _SLACK_IDENTITY_RE.fullmatch(value):
        raise rule_error(f"invalid Slack identity {value!r}: use TEAM:USER, e.g. T0001:U0001")
    return value


SlackIdentity = Annotated[str, AfterValidator(_check_slack_identity)]
"""A Slack user written as ``TEAM_ID:USER_ID``."""

_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def _check_email(value: str) -> str:
    """Catch obvious typos; deliverability is the mail server's business."""
    if not _EMAIL_RE.fullmatch(value):
        raise rule_error(f"invalid email address {value!r}")
    return value


EmailAddress = Annotated[str, AfterValidator(_check_email)]
"""An email address of the plain ``local@domain.tld`` form."""

NonEmptyStr = Annotated[str, Field(min_length=1)]
"""A string that must not be empty."""

Port = Annotated[int, Field(ge=1, le=65535)]
"""A TCP port number."""


def off_from_false(value: object) -> object:
    """YAML 1.1 reads a bare ``off`` as ``False``; take it to mean the string ``"off"``."""
    return "off" if value is False else value


def is_blank(secret: SecretStr | str) -> bool:
    """True when a secret or string is empty or only whitespace."""
    text = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    return not text.strip()


# --- models --------------------------------------------------------------------------------


class StrictModel(BaseModel):
    """Base of every config model: immutable, unknown keys rejected, defaults validated.

    Defaults are validated so that a cross-field rule on a key also runs when the key is
    missing from the file (an enabled Slack channel without any ``signing_secret`` line).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address or `localhost`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
