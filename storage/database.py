"""The database handle: engine set-up per backend, sessions, health check and migrations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, event, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from errors import StorageError
from storage import driver_rows
from storage.autocommit import AutocommitConnections
from storage.sqlite_readers import BUSY_TIMEOUT_MS, SqliteReaders

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

    from storage.recall_vectors import TextEmbedder

MIGRATIONS_PATH = Path(__file__).parent / "migrations"
SUPPORTED_DRIVERS = ("sqlite+aiosqlite", "postgresql+psycopg")


def redact_url(url: str | URL) -> str:
    """The URL as text with any password hidden, safe for logs and error messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable database URL>"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Foreign keys are off by default in SQLite; WAL lets readers run beside the one writer;
    # busy_timeout makes a second writer wait instead of failing at once.
    # The driver's own implicit BEGIN is switched off: `_sqlite_begin` issues BEGIN IMMEDIATE.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cursor.close()


_READS_ONLY = "gateway_reads_only"
"""The execution option of `Database.reading`'s connections."""


def _sqlite_begin(connection: Connection) -> None:
    # A deferred transaction that reads and then writes fails at once with "database is
    # locked" when another writer got in between (busy_timeout cannot help there). Taking the
    # write lock at BEGIN makes every transaction wait its turn instead. A transaction that
    # only reads (`Database.reading`) takes no lock: under WAL it reads its snapshot beside
    # the writer.
    if connection.get_execution_options().get(_READS_ONLY):
        connection.exec_driver_sql("BEGIN DEFERRED")
    else:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def alembic_config() -> AlembicConfig:
    """Alembic configuration pointing at the packaged migrations (no alembic.ini needed)."""
    # Alembic (and Mako under it) is imported only when migrations run: it costs a noticeable
    # part of every CLI start otherwise.
    from alembic.config import Config as AlembicConfig  # noqa: PLC0415

    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS_PATH))
    return config


# Connections kept out of the pool for the driver's statements (PostgreSQL): one for
# accepting messages (the inbox's inserts, one batch at a time), so that an ack never waits
# behind the turns' statements, and eight for the rest: statements that commit by themselves
# (`statement`), a turn's write (`driver_transaction`) and the two halves of a recall search
# (`driver_reading`), none of which waits for another connection while it holds one.
ACCEPTING_CONNECTIONS = 1
LENT_CONNECTIONS = 8
SQLITE_READERS = 4  # SQLite: a recall search reads on two at once
EMBEDDER_KEY = "recall_embedder"
"""The key of the recall `TextEmbedder` in a database session's `info`."""


def _session_options(url: URL) -> str:
    """The server settings of the gateway's PostgreSQL sessions, with the URL's own
    `options` between them:

    - no JIT compilation (`jit=off`) first, so that the URL may turn it back on: the
      gateway's statements are short, and a plan the server estimates as dear (a user's
      first vector read, a generic plan's guess) would otherwise be compiled on the spot,
      6-7 ms of the server's CPU for a statement that runs in a few;
    - the session's time zone set to UTC last, whatever the URL says: psycopg then returns
      every timestamp already in `datetime.UTC`, which the code reads times in, instead of
      the server's zone ("Etc/UTC" is one, converted value by value: about 400 conversions a
      recall search). SQL that turns a time into a day or a month (`date_trunc`, `::date`)
      sees UTC whatever the server's default."""
    given = url.query.get("options", "")
    own = " ".join(given) if isinstance(given, tuple) else given
    return " ".join(part for part in ("-c jit=off", own, "-c TimeZone=UTC") if part)


class Database:
    """One async engine and its session factory.

    SQLite (the embedded default) and PostgreSQL are both supported; the URL picks the driver.
    """

    def __init__(
        self, url: str, *, pool_size: int = 10, max_overflow: int | None = None, echo: bool = False
    ) -> None:
        try:
            parsed = make_url(url)
        except ArgumentError as exc:
            raise StorageError(f"invalid database URL: {exc}") from exc
        if parsed.drivername not in SUPPORTED_DRIVERS:
            raise StorageError(
                f"unsupported database URL {redact_url(parsed)}: use one of "
                + ", ".join(f"{driver}://" for driver in SUPPORTED_DRIVERS)
            )
        self.url = parsed
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        # No pre-ping: it costs a round trip per checkout (a dozen per message). A connection
        # that died (a database restart) fails its statement once instead; SQLAlchemy then
        # discards every connection of the pool opened before, and callers retry.
        options: dict[str, Any] = {"echo": echo}
        if self.is_sqlite:
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            options["connect_args"] = {"timeout": 30}
        else:
            overflow = pool_size if max_overflow is None else max_overflow
            # The autocommit connections `statement` lends are kept out of the pool for good:
            # the pool grows by as many, so sessions keep `pool_size`.
            kept = ACCEPTING_CONNECTIONS + LENT_CONNECTIONS
            options.update(pool_size=pool_size + kept, max_overflow=overflow)
            options["connect_args"] = {"connect_timeout": 5, "options": _session_options(parsed)}
        self.engine: AsyncEngine = create_async_engine(parsed, **options)
        self._lent: AutocommitConnections | None = None
        self._accepting: AutocommitConnections | None = None
        if not self.is_sqlite:
            self._lent = AutocommitConnections(self.engine, size=LENT_CONNECTIONS)
            self._accepting = AutocommitConnections(self.engine, size=ACCEPTING_CONNECTIONS)
        if self.is_sqlite:
            event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
            event.listen(self.engine.sync_engine, "begin", _sqlite_begin)
        # Every session's `info` starts as a copy of this: how the recall embedder
        # (`use_embedder`) reaches the writers of indexed rows.
        self._session_info: dict[str, Any] = {}
        # SQLite: connections of their own for `driver_reading` (not for a database in
        # memory, which each connection would see empty, nor for a URL with options).
        self._sqlite_readers: SqliteReaders | None = None
        if self.is_sqlite and parsed.database not in (None, "", ":memory:") and not parsed.query:
            self._sqlite_readers = SqliteReaders(
                str(parsed.database), size=SQLITE_READERS, info=self._session_info
            )
        self.sessionmaker = async_sessionmaker(
            self.engine, expire_on_commit=False, info=self._session_info
        )
        # On PostgreSQL, sessions whose every statement commits by itself (`single`).
        self._single = (
            self.sessionmaker
            if self.is_sqlite
            else async_sessionmaker(
                self.engine.execution_options(isolation_level="AUTOCOMMIT"),
                expire_on_commit=False,
                info=self._session_info,
            )
        )

        # Sessions that only read (`reading`): on SQLite their transactions take no lock.
        self._reading = (
            async_sessionmaker(
                self.engine.execution_options(**{_READS_ONLY: True}),
                expire_on_commit=False,
                info=self._session_info,
            )
            if self.is_sqlite
            else self.sessionmaker
        )

    def use_embedder(self, embedder: TextEmbedder | None) -> None:
        """Embed every recall entry written from now on with `embedder` (None: stop), in the
        transaction that writes it (`storage.recall_vectors`)."""
        if embedder is None:
            self._session_info.pop(EMBEDDER_KEY, None)
        else:
            self._session_info[EMBEDDER_KEY] = embedder

    @property
    def embedder(self) -> TextEmbedder | None:
        """The recall embedder given with `use_embedder`, if any."""
        embedder: TextEmbedder | None = self._session_info.get(EMBEDDER_KEY)
        return embedder

    @property
    def display_url(self) -> str:
        """The URL with its password hidden."""
        return redact_url(self.url)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A session in one transaction: committed on success, rolled back on error.

        The driver's errors leave as `StorageError` (the cause chained), so no layer above
        `storage` needs to know SQLAlchemy's exception classes.
        """
        async with _transaction(self.sessionmaker) as session:
            yield session

    @asynccontextmanager
    async def driver_transaction(self) -> AsyncIterator[driver_rows.DriverScope]:
        """A transaction for statements through the driver only (`storage.driver_rows`),
        committed when the block ends (or by `driver_rows.Pipeline.commit`), rolled back on
        error. On PostgreSQL on a lent connection, without a session: a session's own work
        (its pool checkout and return, SQLAlchemy's state machine and greenlet hops) cost
        about 0.4 CPU-ms of a turn's write. On SQLite it is `session`."""
        if self._lent is None:
            async with self.session() as session:
                yield session
            return
        async with self._lent.lend_transaction() as lent:
            yield driver_rows.LentConnection(lent.raw, self._session_info)

    @asynccontextmanager
    async def driver_atomic(self) -> AsyncIterator[driver_rows.DriverScope]:
        """A scope whose driver statements all go in one `driver_rows.pipelined` block and
        commit together when it ends, or not at all (an error in the block or of any
        statement). On PostgreSQL a lent autocommit connection: the statements before the
        pipeline's one `Sync` are a single implicit transaction, so no `BEGIN` or `COMMIT`
        goes with them (a turn's write of six statements cost 0.60-0.69 CPU-ms on the client
        and 0.31-0.37 on the server that way in a transaction, 0.39-0.41 and 0.25-0.27
        without, `bench/README.md`). On SQLite, or without lent connections, `session`."""
        if self._lent is None:
            async with self.session() as session:
                yield session
            return
        async with self._lent.lend() as lent:
            yield driver_rows.LentConnection(lent.raw, self._session_info, atomic=True)

    def connections_in_use(self) -> int:
        """Connections a block holds now: the pool's checked out for sessions, and the
        autocommit ones lent (those kept idle for the next block are not in use)."""
        pool = self.engine.pool
        checked_out = int(pool.checkedout()) if hasattr(pool, "checkedout") else 0
        kept_idle = sum(lender.idle for lender in (self._lent, self._accepting) if lender)
        readers = self._sqlite_readers.in_use if self._sqlite_readers else 0
        return checked_out - kept_idle + readers

    @asynccontextmanager
    async def driver_reading(self) -> AsyncIterator[driver_rows.DriverScope]:
        """A scope for statements through the driver that only read and need no one
        snapshot (a recall search's halves): on PostgreSQL a transaction on a lent connection
        (`driver_transaction`, without a session: about 0.5 CPU-ms less for each of a recall
        search's two halves; its statements set planner settings for the transaction), on
        SQLite a connection of its own in autocommit, each statement reading the last commit
        (`storage.sqlite_readers`: about 0.5 CPU-ms less than a session too), or `reading`
        for a database in memory."""
        if self._sqlite_readers is not None:
            async with self._sqlite_readers.reading() as lent:
                yield lent
            return
        if self._lent is None:
            async with self.reading() as session:
                yield session
            return
        async with self.driver_transaction() as scope:
            yield scope

    @asynccontextmanager
    async def single(self) -> AsyncIterator[AsyncSession]:
        """A session for work that is one statement (a lookup, a multi-row insert or update).

        On PostgreSQL the statement commits by itself (autocommit): no `BEGIN` and `COMMIT`
        round trips, which cost as much as the statement does. A statement is atomic on its
        own, so this is only for one; a second one in the session would commit separately.
        On SQLite it is `session`.
        """
        async with _transaction(self._single) as session:
            yield session

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[AsyncSession]:
        """A session that only reads, in one transaction (one snapshot). On SQLite the
        transaction is deferred: it takes no write lock, so it neither waits for the writer
        nor keeps it waiting (not for writes: one could fail at once on a busy database, see
        `_sqlite_begin`); on PostgreSQL it is `session`."""
        async with _transaction(self._reading) as session:
            yield session

    @asynccontextmanager
    async def lookups(self) -> AsyncIterator[AsyncSession]:
        """A session for reads that need no one snapshot, each statement seeing what was
        committed when it ran. On PostgreSQL each statement commits by itself (autocommit: no
        `BEGIN` and `COMMIT` round trips; at READ COMMITTED a transaction's reads see no more
        than that); on SQLite it is `reading` (one deferred transaction, which takes no
        lock). Not for writes, nor for statements that set something for the next one
        (`set_config(…, true)`)."""
        async with _transaction(self._reading if self.is_sqlite else self._single) as session:
            yield session

    @asynccontextmanager
    async def statement(
        self, *, writes: bool, accepting: bool = False
    ) -> AsyncIterator[driver_rows.DriverScope]:
        """A scope for statements through the driver (`storage.driver_rows`) that each commit
        by themselves, usually one: on PostgreSQL a connection in autocommit lent for the
        block (`storage.autocommit`: no session, no checkout from the pool), the one kept for
        accepting messages when `accepting` (the inbox: never behind the turns' statements);
        on SQLite the session `single` gives (`writes`) or `lookups` does."""
        lender = self._accepting if accepting else self._lent
        if lender is not None:
            async with lender.lend() as lent:
                yield lent
            return
        async with self.single() if writes else self.lookups() as session:
            yield session

    async def ping(self, *, within_seconds: float = 2.0) -> None:
        """Run `SELECT 1`; raises `StorageError` with the cause when the database is unusable."""
        try:
            async with asyncio.timeout(within_seconds), self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except TimeoutError as exc:
            raise StorageError(
                f"database {self.display_url} did not answer within {within_seconds:g}s"
            ) from exc
        except (SQLAlchemyError, OSError) as exc:
            raise StorageError(
                f"database {self.display_url} is unreachable: {_first_line(exc)}"
            ) from exc

    async def upgrade(self, revision: str = "head") -> None:
        """Apply migrations up to `revision` (default: the newest)."""
        try:
            async with self.engine.begin() as conn:
                await conn.run_sync(_run_upgrade, revision)
        except (SQLAlchemyError, OSError) as exc:
            raise StorageError(
                f"migrating database {self.display_url} failed: {_first_line(exc)}"
            ) from exc

    async def current_revision(self) -> str | None:
        """The migration revision the database is at, or None for an empty database."""
        from alembic.runtime.migration import MigrationContext  # noqa: PLC0415

        async with self.engine.connect() as conn:
            return await conn.run_sync(
                lambda sync: MigrationContext.configure(sync).get_current_revision()
            )

    @staticmethod
    def head_revision() -> str | None:
        """The newest migration revision shipped with the code."""
        from alembic.script import ScriptDirectory  # noqa: PLC0415

        return ScriptDirectory.from_config(alembic_config()).get_current_head()

    @staticmethod
    def known_revisions() -> frozenset[str]:
        """Every migration revision shipped with the code."""
        from alembic.script import ScriptDirectory  # noqa: PLC0415

        scripts = ScriptDirectory.from_config(alembic_config())
        return frozenset(script.revision for script in scripts.walk_revisions())

    async def dispose(self) -> None:
        """Close every pooled connection."""
        for lender in (self._accepting, self._lent):
            if lender is not None:
                await lender.close()
        if self._sqlite_readers is not None:
            await self._sqlite_readers.close()
        await self.engine.dispose()


def _run_upgrade(connection: Connection, revision: str) -> None:
    from alembic import command  # noqa: PLC0415

    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def _first_line(exc: BaseException) -> str:
    # Driver errors carry the SQL and a documentation link after the first line; the first line
    # is the part an operator needs.
    original = getattr(exc, "orig", None) or exc
    message = str(original).strip().splitlines()
    return message[0] if message else type(original).__name__


@asynccontextmanager
async def _transaction(
    maker: async_sessionmaker[AsyncSession],
) -> AsyncIterator[AsyncSession]:
    """A session of `maker` in one transaction: committed on success, rolled back on error;
    the driver's errors leave as `StorageError`, the cause chained."""
    try:
        async with maker() as session, session.begin():
            yield session
    except SQLAlchemyError as exc:
        raise StorageError(f"database error: {_first_line(exc)}") from exc
