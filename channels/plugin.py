"""What a channel plugs into the gateway: its config section, how to open its adapter, and
which of its settings a running gateway can change.

Each channel subpackage exposes one `ChannelPlugin` as `PLUGIN` in its `plugin` module, and
`channels.registry` lists those modules. The gateway builds the `channels` config section, the
adapters, the HTTP routes and the reload plan from the registry, never from a channel's name.

A plugin module imports only its config schema; the adapter and its platform library (bolt,
botbuilder, the mail libraries) are imported by `open`, so a disabled channel costs nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel
from starlette.routing import BaseRoute

from channels.base import ChannelType, DeliveryReceipt, InboxPort, OutboundMessage
from channels.files import FileLimits, FileStash

SettingsT = TypeVar("SettingsT")
SectionT = TypeVar("SectionT", bound=BaseModel)


class ChannelAdapter(Protocol):
    """A running channel: its listeners, its HTTP routes and its outbound half.

    `send` raises `DeliveryError` when the platform refused or failed; `retry_after` and
    `permanent` on the error tell the outbox whether and when to try again. `reconfigure` takes
    the channel's new settings after a reload; only fields its plugin lists as reloadable
    differ from the ones the adapter was opened with.
    """

    channel_type: ChannelType

    async def open(self) -> None:
        """Open what sending needs (connection pools), in every process that sends: the one
        that accepts and each turn worker (called once, before `start`)."""
        ...

    async def start(self) -> None:
        """Open listeners and check credentials, in the process that accepts (called once,
        after `open`, before the server accepts)."""
        ...

    async def stop(self) -> None:
        """Close listeners and wait for the adapter's own background work."""
        ...

    def routes(self) -> Sequence[BaseRoute]:
        """The HTTP routes the channel serves (none for a channel that listens elsewhere)."""
        ...

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Deliver one reply, or raise `DeliveryError`."""
        ...

    def reconfigure(self, settings: Any) -> None:
        """Apply the channel's reloaded settings (the type its plugin's `settings_of` returns)."""
        ...


class ThreadDirectory(Protocol):
    """Tells whether a channel thread is one the assistant takes part in (the gateway
    implements it over the sessions' channels)."""

    async def has_thread(self, channel_id: str, thread_id: str) -> bool:
        """True when a session owns this thread."""
        ...


class SentMessages(Protocol):
    """Our own replies on this channel, looked up by id (the gateway implements it over the
    outbox table)."""

    async def texts(self, message_ids: Sequence[str]) -> list[str]:
        """The texts of our replies with these ids (platform_message_id or message_id)."""
        ...


class ReplyFeed(Protocol):
    """Reads the replies sent to a user of a pull channel (the gateway implements it over the
    outbox)."""

    async def replies(
        self, user_id: str, *, after: int, limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        """The replies after cursor `after`, oldest first, and the new cursor."""
        ...


class ConversationHistory(Protocol):
    """A user's conversation on a pull channel, both sides, as its page shows it again after a
    reload (the gateway implements it over the sessions' messages and the outbox)."""

    async def history(self, channel_id: str, *, limit: int) -> tuple[list[dict[str, Any]], int]:
        """The last `limit` messages to and from the channel address (feed items, `role`
        "user" or "assistant"), oldest first, and the feed's cursor after the newest reply."""
        ...


class NoHistory:
    """No history kept: the page starts empty and reads the feed from its start."""

    async def history(self, channel_id: str, *, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Nothing."""
        return [], 0


NO_HISTORY = NoHistory()


class ExportReader(Protocol):
    """Reads the export an `/export` link points to (the gateway implements it)."""

    async def export(self, token: str) -> dict[str, Any] | None:
        """The export behind the link's token, or None when unknown or expired."""
        ...


@dataclass(frozen=True, slots=True)
class ChannelServices:
    """What the gateway lends a channel: where messages go in, and the few lookups some
    channels need (each bound to this channel's type)."""

    inbox: InboxPort
    clock: Callable[[], datetime]
    # Called with the HTTP-like status and the reason of every refused inbound request.
    on_rejected: Callable[[int, str], None]
    threads: ThreadDirectory
    sent: SentMessages
    feed: ReplyFeed
    exports: ExportReader
    history: ConversationHistory = NO_HISTORY
    # Where the bytes of files the channel holds at acceptance go (mail parts, web uploads);
    # None: the channel keeps their names only.
    files: FileStash | None = None
    # The files limits in force (`files` in the config; a reload changes them), for a channel
    # that refuses what is over them before accepting (web uploads).
    file_limits: Callable[[], FileLimits] = FileLimits


class CheckSkippedError(Exception):
    """A `gateway doctor` check that does not apply to this configuration (the reason)."""


@dataclass(frozen=True, slots=True)
class DoctorCheck(Generic[SectionT]):
    """One `gateway doctor` check of an enabled channel: what it found, or an exception."""

    name: str
    run: Callable[[SectionT], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class ChannelPlugin(Generic[SectionT, SettingsT]):
    """One channel type as the gateway sees it before anything is opened.

    `reloadable` and `restart_only` name the fields of the config section (top level) and
    together cover all of them except `enabled`, which always needs a restart; a test holds
    the registry to that.
    """

    channel_type: ChannelType
    config_model: type[SectionT]
    settings_of: Callable[[SectionT], SettingsT]
    open: Callable[[SettingsT, ChannelServices], ChannelAdapter]
    reloadable: frozenset[str]
    restart_only: frozenset[str]
    # Replies are fetched by the channel's clients (no send step, no outbox pass).
    pulls_replies: bool = False
    # The adapter delivers `OutboundMessage.file`; other channels get a download link.
    delivers_files: bool = False
    # Cross-section rules: problems as (path inside the section, message, input), given the
    # section and the whole configuration (read-only) — e.g. web tokens naming known users.
    check: Callable[[SectionT, Any], list[tuple[tuple[str | int, ...], str, object]]] | None = None
    # Looks up a sender's email address (for linking identities by email), when the
    # platform can tell.
    email_lookup: Callable[[ChannelAdapter], Callable[[str], Awaitable[str | None]]] | None = None
    # What `gateway doctor` checks when the channel is on (the platform accepts our secrets).
    doctor: tuple[DoctorCheck[SectionT], ...] = ()
    # How people call the channel in a sentence ("the Slack channel is off").
    title: str = ""

    @property
    def name(self) -> str:
        """The section's key under `channels:` (the channel type's value)."""
        return self.channel_type.value

    def enabled(self, section: BaseModel) -> bool:
        """Whether the section switches the channel on."""
        return bool(getattr(section, "enabled", False))
