"""A real SMTP server on loopback (aiosmtpd) that keeps what it receives, for outbound tests.

It runs in the test's event loop, records each delivered mail (envelope and raw bytes), and
can be scripted to answer the next DATA commands with an SMTP error (``451 …``, ``550 …``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser

from aiosmtpd.smtp import SMTP, Envelope, Session


@dataclass
class Delivery:
    """One mail the sink accepted."""

    mail_from: str
    rcpt_tos: list[str]
    data: bytes

    @property
    def message(self) -> EmailMessage:
        """The mail, parsed."""
        return BytesParser(policy=policy.default).parsebytes(self.data)


@dataclass
class SmtpSink:
    """Start with `start()`, read `deliveries`, script failures with `fail_next`."""

    host: str = "127.0.0.1"
    deliveries: list[Delivery] = field(default_factory=list)
    _failures: deque[str] = field(default_factory=deque)
    _server: asyncio.Server | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        """Listen on a free loopback port in the running event loop."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: SMTP(self, hostname="sink.test", loop=loop), host=self.host, port=0
        )

    async def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    @property
    def port(self) -> int:
        """The bound port."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def fail_next(self, status_line: str, times: int = 1) -> None:
        """Answer the next `times` DATA commands with `status_line` (e.g. "451 4.3.0 busy")."""
        self._failures.extend([status_line] * times)

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[Delivery]:
        """The deliveries, once there are at least `count`."""
        async with asyncio.timeout(timeout):
            while len(self.deliveries) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.deliveries

    async def handle_DATA(self, _server: SMTP, _session: Session, envelope: Envelope) -> str:  # noqa: N802
        """Keep the mail, or answer the next scripted failure."""
        if self._failures:
            return self._failures.popleft()
        self.deliveries.append(
            Delivery(
                mail_from=envelope.mail_from or "",
                rcpt_tos=list(envelope.rcpt_tos),
                data=envelope.original_content or b"",
            )
        )
        self._arrived.set()
        return "250 2.0.0 OK"
