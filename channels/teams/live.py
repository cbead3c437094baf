"""Live replies on Teams: the answer streamed into a personal chat, a typing indicator
elsewhere, and the final message that finishes a stream exactly once.

Personal chats (`TeamsLiveReply`): a status is an informative update, the answer so far a
streaming update (cumulative text, `streamSequence` 1, 2, 3 …); the first request creates the
stream, and its id is the handle the gateway stores. Teams ends a stream two minutes after it
started, so updates stop at `UPDATES_UNTIL` and the final message must leave room too.
Group chats and channels cannot stream (`TeamsTypingReply`): the assistant shows a typing
indicator, repeated while the turn runs since Teams clears it after a few seconds.

`TeamsStreams.finish` is what `TeamsChannel.send` does with a reply that has a live handle:
the final `message` (streaminfo `final`, the stream id, the full text). A stream the user
stopped (Teams answers 403 `ContentStreamNotAllowed`, remembered in memory) gets no second
message: its reply counts as delivered, since the stored reply keeps the full text. The same
403 answers a final sent again after it already went through, which makes retries and
restarts idempotent. A stream too old to finish gets a plain message instead.

Every request to a chat waits its turn in the channel's `ChatPace` (one a second per chat,
from the end of the previous request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import datetime
from typing import Any, Literal

import structlog
from botbuilder.schema import Activity, ActivityTypes  # type: ignore[import-untyped]

from channels.base import Conversation, DeliveryReceipt
from channels.live import LiveReply, LiveStoppedError, ReplyTarget
from channels.teams.connector import ChatPace, ConnectorError, TeamsConnector, message_activity
from channels.teams.parse import split_conversation_id
from channels.teams.streaminfo import (
    FINAL_UNTIL,
    INFORMATIVE_MAX_CHARS,
    UPDATES_UNTIL,
    StreamHandle,
    StreamType,
    stream_final,
    stream_update,
)
from primitives.bounded_cache import BoundedCache

log = structlog.stdlib.get_logger(__name__)

LIVE_INTERVAL = 1.0  # seconds between two requests to one chat (Teams' pace)
TYPING_EVERY = 3.0  # Teams shows a typing indicator for about this long
TYPING_FOR = 120.0  # a turn longer than this shows no more typing
STREAMS_REMEMBERED = 10_000
STREAM_REFUSED = "ContentStreamNotAllowed"

Refusal = Literal["stopped", "expired", "too_large"]


class TeamsStreams:
    """The channel's live replies and what it knows of their streams (stopped by the user,
    finished, expired), shared by every reply of the process."""

    def __init__(
        self, connector: TeamsConnector, pace: ChatPace, clock: Callable[[], datetime]
    ) -> None:
        self.connector = connector
        self.pace = pace
        self.clock = clock
        # stream id → what became of it; memory only, the connector's 403 covers restarts.
        self.ended: BoundedCache[str, Refusal | Literal["finished"]] = BoundedCache(
            STREAMS_REMEMBERED
        )
        # stream id → the plain message sent instead of its final (a retry sends no other).
        self.replaced: BoundedCache[str, DeliveryReceipt] = BoundedCache(STREAMS_REMEMBERED)

    def reply(
        self, target: ReplyTarget, resume: Mapping[str, Any] | None = None
    ) -> LiveReply | None:
        """The live reply for a turn answering `target`, or None when it has no reference."""
        reference = target.reply_context.get("conversation_reference")
        if not isinstance(reference, Mapping) or not reference.get("serviceUrl"):
            return None
        conversation = reference.get("conversation")
        conversation = conversation if isinstance(conversation, Mapping) else {}
        chat, _root = split_conversation_id(str(conversation.get("id") or ""))
        if not chat:
            return None
        personal = (
            target.conversation is Conversation.DIRECT
            and conversation.get("conversationType") == "personal"
            and not conversation.get("isGroup")
        )
        if personal:
            handle = StreamHandle.from_json(resume) if resume is not None else None
            return TeamsLiveReply(self, reference, chat, resumed=resume is not None, handle=handle)
        thread = target.thread_id or str(target.reply_context.get("thread_root") or "")
        return TeamsTypingReply(self, reference, chat, thread)

    async def finish(
        self, reference: Mapping[str, Any], thread: str, text: str, live: Mapping[str, Any]
    ) -> DeliveryReceipt:
        """Deliver a reply whose answer was streamed: the final message of its stream, or a
        plain message when the stream cannot take one; raises `DeliveryError`."""
        conversation = reference.get("conversation")
        chat_id = conversation.get("id") if isinstance(conversation, Mapping) else None
        chat, _root = split_conversation_id(str(chat_id or ""))
        handle = StreamHandle.from_json(live)
        if handle is None or handle.conversation_id != chat:
            log.warning("teams.live_handle_ignored", handle=dict(live), conversation=chat)
            return await self.plain(reference, thread, text)
        replaced = self.replaced.get(handle.stream_id)
        if replaced is not None:
            return replaced
        ended = self.ended.get(handle.stream_id)
        if ended in ("finished", "stopped"):
            if ended == "stopped":
                log.info("teams.stream_stopped", stream_id=handle.stream_id, known="memory")
            return DeliveryReceipt(platform_message_id=handle.stream_id)
        if ended == "expired" or handle.age(self.clock()) > FINAL_UNTIL:
            log.info("teams.stream_expired", stream_id=handle.stream_id)
            return await self._instead(handle, reference, thread, text)
        try:
            async with self.pace.request(chat):
                await self.connector.post(
                    reference, thread, stream_final(text, stream_id=handle.stream_id)
                )
        except ConnectorError as exc:
            return await self._final_refused(exc, handle, reference, thread, text)
        self.ended.put(handle.stream_id, "finished")
        log.info("teams.stream_finished", stream_id=handle.stream_id, chars=len(text))
        return DeliveryReceipt(platform_message_id=handle.stream_id)

    async def _final_refused(
        self,
        exc: ConnectorError,
        handle: StreamHandle,
        reference: Mapping[str, Any],
        thread: str,
        text: str,
    ) -> DeliveryReceipt:
        refusal = refusal_of(exc)
        if refusal == "stopped":
            # The user's Stop, or this very final sent before (a retry): nothing more to post.
            self.ended.put(handle.stream_id, "stopped")
            log.info(
                "teams.stream_stopped",
                stream_id=handle.stream_id,
                known="connector",
                detail=exc.detail,
            )
            return DeliveryReceipt(platform_message_id=handle.stream_id)
        if refusal == "expired" or exc.status in (400, 404):
            # The stream cannot take the answer; the answer must still arrive once.
            self.ended.put(handle.stream_id, "expired")
            log.warning(
                "teams.stream_final_refused",
                stream_id=handle.stream_id,
                status=exc.status,
                code=exc.code,
                detail=exc.detail,
            )
            return await self._instead(handle, reference, thread, text)
        raise exc

    async def _instead(
        self, handle: StreamHandle, reference: Mapping[str, Any], thread: str, text: str
    ) -> DeliveryReceipt:
        """A plain message instead of the stream's final, sent once per stream."""
        receipt = await self.plain(reference, thread, text)
        self.replaced.put(handle.stream_id, receipt)
        return receipt

    async def plain(self, reference: Mapping[str, Any], thread: str, text: str) -> DeliveryReceipt:
        """The answer as a plain message, paced like every request to the chat: it may follow
        a typing indicator or a refused final at once."""
        conversation = reference.get("conversation")
        chat_id = conversation.get("id") if isinstance(conversation, Mapping) else None
        async with self.pace.request(split_conversation_id(str(chat_id or ""))[0]):
            identifier = await self.connector.post(reference, thread, message_activity(text))
        return DeliveryReceipt(platform_message_id=identifier)


class TeamsLiveReply:
    """The answer streamed into a personal chat (see the module docstring).

    Once the user stopped the stream, `status` and `text` raise `LiveStoppedError`. After a
    restart (`resumed`) nothing is sent: the stream's sequence is lost with the process, and
    the final message finishes the stream all the same.
    """

    def __init__(
        self,
        streams: TeamsStreams,
        reference: Mapping[str, Any],
        chat: str,
        *,
        resumed: bool = False,
        handle: StreamHandle | None = None,
    ) -> None:
        self._streams = streams
        self._reference = reference
        self._chat = chat
        self._resumed = resumed
        self._handle = handle
        self._sequence = 0
        self._shown = ""  # the answer's text as the stream shows it
        self._quiet = resumed  # no more updates (resumed, too old, refused)

    @property
    def handle(self) -> Mapping[str, Any] | None:
        """The stream's handle once the first update created it."""
        return self._handle.as_json() if self._handle is not None else None

    async def status(self, text: str) -> None:
        """An informative update, until the answer's text streams."""
        self._check_stopped()
        if self._quiet or self._shown or not text.strip():
            return
        await self._update("informative", text[:INFORMATIVE_MAX_CHARS])

    async def text(self, text: str) -> None:
        """A streaming update with the answer so far. Teams wants each update to extend the
        last one: a text that replaces it (the model started over) waits for the final."""
        self._check_stopped()
        if self._quiet or not text.strip() or text == self._shown:
            return
        if not text.startswith(self._shown):
            log.info("teams.stream_text_replaced", stream_id=self._stream_id())
            return
        await self._update("streaming", text)

    async def close(self, *, committed: bool) -> None:
        """Nothing to clear: the final message ends the stream (or, without a reply, Teams
        ends it after two minutes; a restarted turn finishes it before that)."""

    def _check_stopped(self) -> None:
        if (
            self._handle is not None
            and self._streams.ended.get(self._handle.stream_id) == "stopped"
        ):
            raise LiveStoppedError(f"the user stopped stream {self._handle.stream_id}")

    def _stream_id(self) -> str | None:
        return self._handle.stream_id if self._handle is not None else None

    async def _update(self, stream_type: StreamType, text: str) -> None:
        streams = self._streams
        if self._handle is not None and self._handle.age(streams.clock()) >= UPDATES_UNTIL:
            self._quiet = True
            log.info("teams.stream_updates_ended", stream_id=self._handle.stream_id)
            return
        sequence = self._sequence + 1
        activity = stream_update(
            text, stream_type=stream_type, sequence=sequence, stream_id=self._stream_id()
        )
        try:
            async with streams.pace.request(self._chat):
                sent_at = streams.clock()
                identifier = await streams.connector.post(self._reference, "", activity)
        except ConnectorError as exc:
            if refusal_of(exc) is None:
                raise  # a rate limit or an outage: the gateway pauses or stops the updates
            raise self._refused(exc) from exc
        self._sequence = sequence
        if stream_type == "streaming":
            self._shown = text
        if self._handle is None:
            if not identifier:
                self._quiet = True
                raise ConnectorError("the Bot Connector gave the new stream no id", permanent=True)
            self._handle = StreamHandle(identifier, self._chat, sent_at)
            log.info("teams.stream_started", stream_id=identifier, conversation=self._chat)

    def _refused(self, exc: ConnectorError) -> Exception:
        """What a 403 `ContentStreamNotAllowed` to an update means for the live updates."""
        refusal = refusal_of(exc) or "stopped"
        self._quiet = True
        if self._handle is None:
            # Refused before any stream existed: streaming is not allowed for this bot or
            # user. No handle, so the reply goes out as a plain message.
            log.warning("teams.streaming_refused", detail=exc.detail, conversation=self._chat)
            return ConnectorError(str(exc), status=exc.status, code=exc.code, permanent=True)
        stream_id = self._handle.stream_id
        self._streams.ended.put(stream_id, refusal)
        if refusal == "stopped":
            log.info("teams.stream_stopped", stream_id=stream_id, known="update")
            return LiveStoppedError(f"the user stopped stream {stream_id}")
        log.warning("teams.stream_refused", stream_id=stream_id, refusal=refusal, detail=exc.detail)
        return ConnectorError(str(exc), status=exc.status, code=exc.code, permanent=True)


class TeamsTypingReply:
    """A typing indicator in a group chat or a channel, which cannot stream: shown at the
    first status and repeated every `TYPING_EVERY` seconds until the turn closes."""

    def __init__(
        self, streams: TeamsStreams, reference: Mapping[str, Any], chat: str, thread: str
    ) -> None:
        self._streams = streams
        self._reference = reference
        self._chat = chat
        self._thread = thread
        self._last_typing: float | None = None
        self._started = streams.pace.monotonic()
        self._keepalive: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def handle(self) -> Mapping[str, Any] | None:
        """None: a typing indicator is no message."""
        return None

    async def status(self, text: str) -> None:
        """Show that the assistant is typing (the status text cannot be shown here)."""
        if self._closed:
            return
        if self._keepalive is None:
            self._keepalive = asyncio.create_task(self._keep_typing(), name="teams-typing")
        await self._typing()

    async def text(self, text: str) -> None:
        """Nothing: the answer arrives as one message."""

    async def close(self, *, committed: bool) -> None:
        """Stop repeating the typing indicator (the reply's message clears it)."""
        self._closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
            with suppress(asyncio.CancelledError):
                await self._keepalive

    @property
    def typing_repeats(self) -> bool:
        """Whether the indicator is still being repeated."""
        return self._keepalive is not None and not self._keepalive.done()

    async def _typing(self) -> None:
        pace = self._streams.pace
        now = pace.monotonic()
        if self._last_typing is not None and now - self._last_typing < TYPING_EVERY:
            return
        self._last_typing = now
        async with pace.request(self._chat):
            await self._streams.connector.post(
                self._reference, self._thread, Activity(type=ActivityTypes.typing)
            )

    async def _keep_typing(self) -> None:
        pace = self._streams.pace
        while not self._closed and pace.monotonic() - self._started < TYPING_FOR:
            await pace.sleep(TYPING_EVERY)
            try:
                await self._typing()
            except ConnectorError as exc:
                log.info("teams.typing_failed", error=str(exc), conversation=self._chat)
                if exc.permanent:
                    return
                await pace.sleep(exc.retry_after or TYPING_EVERY)


def refusal_of(exc: ConnectorError) -> Refusal | None:
    """What a 403 `ContentStreamNotAllowed` says of the stream, or None for other failures:
    expired (the two minutes are over), too large (the text), else stopped (the user's Stop,
    or a stream already finished)."""
    if exc.status != 403 or exc.code != STREAM_REFUSED:
        return None
    detail = exc.detail.lower()
    if "time" in detail:
        return "expired"
    if "too large" in detail:
        return "too_large"
    return "stopped"
