"""Tools for breaking things on purpose: a TCP proxy that can cut a server off, and a switch
that stops a PostgreSQL database from taking connections."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
from psycopg import sql


class CuttableProxy:
    """A TCP proxy on loopback to `upstream`; `cut()` drops every connection and refuses new
    ones (as a crashed or unreachable server would), `restore()` lets them through again."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self.down = False

    async def start(self) -> None:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        """Drop the open connections and refuse new ones."""
        self.down = True
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    def restore(self) -> None:
        """Accept and forward connections again."""
        self.down = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._open.update({writer, up_writer})
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._open.discard(writer)
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                writer.close()


def block_database(admin_url: str, database: str, *, blocked: bool) -> None:
    """Make PostgreSQL refuse (or accept again) connections to `database`; blocking also ends
    the connections already open, as a database restart would."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                sql.Identifier(database), sql.SQL("false" if blocked else "true")
            )
        )
        if blocked:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )
