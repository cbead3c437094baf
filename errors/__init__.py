"""The gateway's one error tree.

Every layer raises from this tree, so it lives in a neutral package of its own that every
other package may import (it imports nothing of the gateway)::

    GatewayError                  anything the gateway raises on purpose
    ├── ConfigError               the config file is unreadable, invalid or names a missing env var
    ├── ChannelAuthError          an inbound request failed verification (signature, JWT, DKIM …)
    ├── ChannelPayloadError       an inbound payload is malformed or unsupported
    ├── RejectedRequestError      an inbound HTTP request is refused with a status (413, 401 …)
    ├── DeliveryError             a platform did not accept a reply (maybe retry later)
    ├── RoutingError              a message cannot be tied to a user or session
    ├── SessionStateError         an illegal session lifecycle transition
    ├── StorageError              the database or the transcript store failed
    │   └── ArchiveExistsError    an immutable archive object already exists
    ├── LLMError                  the language model could not produce an answer
    └── ToolError                 a tool (an MCP server's) could not be called or timed out

Catch the narrowest class that the caller can act on; `GatewayError` itself is caught only at
process edges (the CLI, the HTTP app) to turn it into a clear message.
"""

from __future__ import annotations

from collections.abc import Sequence


class GatewayError(Exception):
    """Base of every error the gateway raises deliberately."""


class ConfigError(GatewayError):
    """The configuration cannot be used; the message names the file, key and problem.

    `problems` holds one line per problem (the message is those lines joined by newlines).
    """

    def __init__(self, message: str, *, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[str, ...] = tuple(problems) or (message,)


class ChannelAuthError(GatewayError):
    """An inbound request did not prove who sent it."""


class ChannelPayloadError(GatewayError):
    """An inbound payload is malformed or of a kind the channel does not handle."""


class RejectedRequestError(GatewayError):
    """An inbound HTTP request is refused with `status` and a `reason` the client is shown.

    For answers other than 400 (a `ChannelPayloadError`): too large, unauthenticated, forbidden,
    not found, or the message could not be stored.
    """

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class DeliveryError(GatewayError):
    """A platform did not accept a reply.

    `retry_after` (seconds) is the platform's own hint (HTTP `Retry-After`); `permanent` says
    that retrying cannot help (unknown channel, revoked token), so the outbox gives up at once.
    """

    def __init__(
        self, message: str, *, retry_after: float | None = None, permanent: bool = False
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.permanent = permanent


class RoutingError(GatewayError):
    """A message cannot be tied to a user or a session."""


class SessionStateError(GatewayError):
    """A session lifecycle transition that the state machine does not allow."""


class StorageError(GatewayError):
    """The database or the transcript store failed; `key` names the object, when there is one."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(f"{message} (key {key})" if key else message)
        self.key = key


class ArchiveExistsError(StorageError):
    """An archive object is immutable and one already exists under that key."""


class LLMError(GatewayError):
    """The language model call failed after its retries."""


class ToolError(GatewayError):
    """A tool call did not produce a result: its server is unavailable, broke off or timed
    out; `key` names the server. The model is told, the turn goes on."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key
