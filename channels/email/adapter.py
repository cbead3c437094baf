"""The email channel: an SMTP server for inbound mail (aiosmtpd) and replies over SMTP (or
written to a folder as ``.eml`` files, outbound ``mode: files``).

Inbound, in the order a mail meets them:

* ``RCPT TO`` another address than the assistant's: ``550``; a mail over
  ``max_message_bytes``: ``552`` (aiosmtpd, also on an announced ``SIZE``).
* Bounces, auto-responders, list mail and our own mail: accepted (``250``), never routed
  (`channels.email.guard`): answering them would start a loop.
* Sender authentication (`channels.email.auth`, DNS in a worker thread): a failure in
  ``verify`` mode is refused with ``550 5.7.1`` (we are the edge: the refusal goes to the
  connecting server, never a bounce of ours to a forged sender); in ``trusted_mta`` mode the
  MTA in front of us already accepted the mail, so it is accepted and dropped (a refusal would
  make that MTA bounce to the possibly forged sender). DNS trouble: ``451``.
* More than ``replies_per_sender_per_hour`` routed mails from one sender: ``451``.
* Unparseable mail (no sender, not mail): ``550 5.6.0`` with the reason.
* Otherwise the parsed message is committed to the inbox, then ``250``; a storage or any
  other internal failure answers ``451`` so the sending MTA retries and nothing is lost.
  Duplicates (same Message-ID) are recognised by the inbox and answered ``250``.

Every refusal or drop is logged (``email.rejected`` / ``email.ignored``) with ids, never
content. The server runs in the gateway's own event loop (``loop.create_server``), since the
inbox's database engine lives there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import structlog
from aiosmtpd.smtp import SMTP, Envelope, Session
from starlette.routing import Route

from channels.base import (
    ChannelMessage,
    ChannelType,
    DeliveryReceipt,
    InboxPort,
    OutboundMessage,
)
from channels.email.auth import AuthVerdict, Resolver, authenticate, dns_resolver
from channels.email.auth import Envelope as SmtpEnvelope
from channels.email.guard import SenderRateLimit, unanswerable_reason
from channels.email.headers import read_headers
from channels.email.outbound import (
    ReplyFolder,
    ReplyTransport,
    SmtpRelay,
    compose_reply,
    domain_of,
)
from channels.email.parse import parse_email, references_of
from channels.email.parts import attachment_parts
from channels.files import STASH_KEY, FileStash
from channels.plugin import SentMessages
from errors import ChannelPayloadError, GatewayError, StorageError

__all__ = ["EmailChannel", "EmailSettings", "SentMessages", "parse_email"]

log = structlog.stdlib.get_logger(__name__)

SMTP_TIMEOUT = 300.0  # idle seconds before the server drops a session (RFC 5321 §4.5.3.2)


@dataclass(frozen=True, slots=True)
class EmailSettings:
    """The email channel's configuration."""

    addresses: tuple[str, ...]
    listen_host: str
    listen_port: int
    max_message_bytes: int
    auth_mode: Literal["verify", "trusted_mta", "off"]
    trusted_authserv_id: str | None
    outbound_host: str
    outbound_port: int
    outbound_starttls: bool
    outbound_username: str
    outbound_password: str
    tls_cert: Path | None = None  # STARTTLS for the inbound server
    tls_key: Path | None = None
    replies_per_sender_per_hour: int = 30
    # smtp: replies go to the relay above; files: each is written to outbound_directory.
    outbound_mode: Literal["smtp", "files"] = "smtp"
    outbound_directory: Path = Path("./var/outbox")


class EmailChannel:
    """The SMTP server for inbound mail and the outbound half (`send`)."""

    channel_type = ChannelType.EMAIL

    def __init__(
        self,
        settings: EmailSettings,
        inbox: InboxPort,
        *,
        clock: Callable[[], datetime],
        sent: SentMessages | None = None,
        resolver: Resolver = dns_resolver,
        on_rejected: Callable[[int, str], None] | None = None,
        files: FileStash | None = None,
    ) -> None:
        self.settings = settings
        # Where the attachments' bytes wait for the turn (None: their names only).
        self.files = files
        self.inbox = inbox
        self.clock = clock
        self.sent = sent
        self.resolver = resolver
        self.on_rejected = on_rejected or (lambda _status, _reason: None)
        self.addresses = frozenset(address.lower() for address in settings.addresses)
        self.rate_limit = SenderRateLimit(settings.replies_per_sender_per_hour, clock=clock)
        self._server: asyncio.Server | None = None

    # --- server lifecycle -------------------------------------------------------------

    async def open(self) -> None:
        """Nothing to open: each reply is one SMTP session with the relay (or one file)."""

    async def start(self) -> None:
        """Listen on ``listen_host:listen_port`` in the running event loop."""
        if self._server is not None:
            return
        if self.settings.auth_mode == "off":
            log.warning("email.auth_off", detail="sender authentication is off (development)")
        loop = asyncio.get_running_loop()
        handler = _Handler(self)
        tls = self._tls_context()
        hostname = domain_of(self.settings.addresses[0]) if self.settings.addresses else None
        try:
            self._server = await loop.create_server(
                lambda: SMTP(
                    handler,
                    data_size_limit=self.settings.max_message_bytes,
                    enable_SMTPUTF8=True,
                    hostname=hostname,
                    tls_context=tls,
                    timeout=SMTP_TIMEOUT,
                    loop=loop,
                ),
                host=self.settings.listen_host,
                port=self.settings.listen_port,
            )
        except OSError as exc:
            raise GatewayError(
                f"cannot listen for email on {self.settings.listen_host}:"
                f"{self.settings.listen_port} (channels.email): {exc.strerror or exc}"
            ) from exc
        log.info("email.listening", host=self.settings.listen_host, port=self.port, tls=bool(tls))

    def reconfigure(self, settings: EmailSettings) -> None:
        """Apply reloaded settings: the sender checks, the rate limit and outbound delivery
        take effect with the next mail (the listener's address and TLS need a restart)."""
        if settings.auth_mode == "off" and self.settings.auth_mode != "off":
            log.warning("email.auth_off", detail="sender authentication is off (development)")
        self.settings = settings
        self.addresses = frozenset(address.lower() for address in settings.addresses)
        self.rate_limit.per_hour = settings.replies_per_sender_per_hour  # the window stays

    async def stop(self) -> None:
        """Stop listening (sessions in progress finish on their own)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    def routes(self) -> list[Route]:
        """None: mail arrives on the SMTP listener, not over HTTP."""
        return []

    @property
    def port(self) -> int:
        """The bound port (useful with ``listen_port: 0``)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the email channel is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    def _tls_context(self) -> ssl.SSLContext | None:
        if self.settings.tls_cert is None or self.settings.tls_key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.settings.tls_cert, self.settings.tls_key)
        return context

    # --- outbound -----------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Send one reply; raises `DeliveryError` (4xx, connection and file system errors
        retryable, 5xx permanent). The receipt carries our Message-ID, which replies to it
        will name."""
        our_address = self._our_address(str(message.reply_context.get("from") or ""))
        mail, our_id = compose_reply(message, our_address=our_address, now=self.clock())
        recipient = str(message.reply_context["reply_to"])
        where = await self._transport().deliver(mail, sender=our_address, recipient=recipient)
        log.info(
            "email.sent",
            outbound_id=message.message_id,
            platform_message_id=our_id,
            transport=self.settings.outbound_mode,
            to=where,
        )
        return DeliveryReceipt(platform_message_id=our_id)

    def _transport(self) -> ReplyTransport:
        # Built per reply from the current settings, so a reload applies to the next one.
        if self.settings.outbound_mode == "files":
            return ReplyFolder(self.settings.outbound_directory)
        return SmtpRelay(
            host=self.settings.outbound_host,
            port=self.settings.outbound_port,
            starttls=self.settings.outbound_starttls,
            username=self.settings.outbound_username,
            password=self.settings.outbound_password,
        )

    def _our_address(self, candidate: str) -> str:
        if candidate.lower() in self.addresses:
            return candidate.lower()
        return self.settings.addresses[0].lower()

    # --- inbound ------------------------------------------------------------------------

    def check_recipient(self, address: str) -> str | None:
        """None for one of the assistant's addresses, else the refusal to answer."""
        if address.strip("<> ").lower() in self.addresses:
            return None
        return self._reject(550, "5.1.1 No such recipient here")

    async def receive(self, data: bytes, envelope: SmtpEnvelope, recipients: Sequence[str]) -> str:
        """Handle one mail that passed RCPT and size checks; the SMTP status line to answer."""
        sender = envelope.mail_from.strip("<> ").lower()
        head = await asyncio.to_thread(read_headers, data)
        if head is None:
            return self._reject(550, "5.6.0 Unreadable header block")
        reason = unanswerable_reason(head, mail_from=envelope.mail_from, ours=self.addresses)
        if reason is not None:
            log.info("email.ignored", reason=reason, size=len(data))
            return "250 2.0.0 Accepted (not answered: automatic or own mail)"
        verdict = await asyncio.to_thread(
            authenticate,
            data,
            mode=self.settings.auth_mode,
            envelope=envelope,
            resolver=self.resolver,
            trusted_authserv_id=self.settings.trusted_authserv_id,
        )
        if not verdict.passed:
            return self._unauthenticated(verdict)
        if not self.rate_limit.allows(sender):
            return self._reject(451, "4.7.1 Too many messages from this sender, try again later")
        try:
            message = await self._parse(data, recipients[0])
        except ChannelPayloadError as exc:
            return self._reject(550, f"5.6.0 {exc}")
        message = dataclasses.replace(message, raw={**message.raw, "auth": verdict.to_dict()})
        try:
            message = await self._stash_attachments(message, data)
            result = await self.inbox.accept(message)
        except StorageError as exc:
            log.error("email.store_failed", message_id=message.message_id, error=str(exc))
            await self._discard_attachments(message)
            return self._reject(451, "4.3.0 Temporary failure storing the message, try again")
        if result.accepted:
            self.rate_limit.record(sender)
        else:
            await self._discard_attachments(message)  # the first copy has its own
        log.info(
            "email.accepted",
            message_id=message.message_id,
            thread_id=message.thread_id,
            duplicate=not result.accepted,
            forwarded=message.forwarded is not None,
        )
        return f"250 2.0.0 OK {'duplicate' if not result.accepted else 'queued'}"

    async def _stash_attachments(self, message: ChannelMessage, data: bytes) -> ChannelMessage:
        """The message with its attachments' bytes in the stash (nested ones included), so
        the turn can read them; unchanged without a stash or attachments."""
        if self.files is None or not message.attachments:
            return message
        stashed = []
        for attachment, payload in await asyncio.to_thread(attachment_parts, data):
            key = await self.files.put(payload)
            stashed.append(dataclasses.replace(attachment, source={STASH_KEY: key}))
        return dataclasses.replace(message, attachments=tuple(stashed))

    async def _discard_attachments(self, message: ChannelMessage) -> None:
        if self.files is None:
            return
        for attachment in message.attachments:
            key = attachment.source.get(STASH_KEY)
            if isinstance(key, str):
                await self.files.discard(key)

    async def _parse(self, data: bytes, recipient: str) -> ChannelMessage:
        own_texts: list[str] = []
        references = await asyncio.to_thread(references_of, data)
        if references and self.sent is not None:
            own_texts = await self.sent.texts(references)
        return await asyncio.to_thread(
            parse_email,
            data,
            own_texts=own_texts,
            recipient=recipient.strip("<> ").lower(),
            received_at=self.clock(),
        )

    def _unauthenticated(self, verdict: AuthVerdict) -> str:
        details = {"mode": verdict.mode, "from_domain": verdict.from_domain}
        if verdict.temporary:
            return self._reject(451, "4.7.0 Sender authentication temporarily failed", **details)
        if verdict.mode == "trusted_mta":
            log.warning("email.rejected", status=250, reason=verdict.reason, **details)
            self.on_rejected(250, verdict.reason)
            return "250 2.0.0 Accepted (not routed: sender not authenticated)"
        return self._reject(550, f"5.7.1 Sender not authenticated: {verdict.reason}", **details)

    def _reject(self, status: int, text: str, **details: object) -> str:
        text = " ".join(text.split())[:300]  # one SMTP line, whatever the reason held
        log.warning("email.rejected", status=status, reason=text, **details)
        self.on_rejected(status, text)
        return f"{status} {text}"


class _Handler:
    """aiosmtpd's hooks, delegating to the channel."""

    def __init__(self, channel: EmailChannel) -> None:
        self.channel = channel

    async def handle_RCPT(  # noqa: N802 (aiosmtpd's hook name)
        self,
        _server: SMTP,
        _session: Session,
        envelope: Envelope,
        address: str,
        _options: list[str],
    ) -> str:
        """Only the assistant's own addresses are accepted."""
        refusal = self.channel.check_recipient(address)
        if refusal is not None:
            return refusal
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(  # noqa: N802 (aiosmtpd's hook name)
        self, _server: SMTP, session: Session, envelope: Envelope
    ) -> str:
        """Answer only once the mail is committed (or deliberately not routed)."""
        data = envelope.original_content or b""
        peer = session.peer[0] if isinstance(session.peer, tuple) else None
        smtp_envelope = SmtpEnvelope(
            client_ip=peer, helo=session.host_name or "", mail_from=envelope.mail_from or ""
        )
        try:
            return await self.channel.receive(data, smtp_envelope, envelope.rcpt_tos)
        except Exception:  # any failure must become a 451: the MTA retries, nothing is lost
            log.exception("email.internal_error", size=len(data))
            return "451 4.3.0 Internal error, try again later"
