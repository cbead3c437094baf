"""The `gateway` command line: run the server, check a config, migrate the database.

Heavy imports (SQLAlchemy, the HTTP stack) happen inside the commands that need them, so
`gateway config check` answers quickly.

Every failure the operator can fix ends as one clear line on stderr and a non-zero exit code,
never a traceback: 2 for an invalid config or command line, 1 for anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from errors import ConfigError, GatewayError
from gateway.admin_cli import add_admin_commands
from gateway.config import check_config, load_config
from gateway.log import configure_logging

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway", description="The multi-channel assistant gateway."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="serve HTTP (and the enabled channels)")
    run.add_argument("--config", type=Path, help="YAML config (default: embedded defaults)")
    run.add_argument("--log-format", choices=["json", "console"], help="override logging.format")
    run.add_argument(
        "--role",
        choices=["all", "turns"],
        default="all",
        help="all: serve and run turns (or start server.turn_workers); turns: a turn worker only",
    )
    run.add_argument(
        "--worker",
        type=int,
        default=0,
        metavar="N",
        help="with --role turns: which of server.turn_workers this is, from 0 (the share of "
        "the senders it hears of first; `gateway run` numbers the workers it starts)",
    )
    run.set_defaults(handler=_run)

    config = commands.add_parser("config", help="configuration tools")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    check = config_commands.add_parser("check", help="validate a config file")
    check.add_argument("file", type=Path)
    check.set_defaults(handler=_config_check)
    reference = config_commands.add_parser(
        "reference", help="print the configuration reference (Markdown)"
    )
    reference.set_defaults(handler=_config_reference)

    db = commands.add_parser("db", help="database tools")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="apply the database migrations")
    upgrade.add_argument("--config", type=Path, help="YAML config (default: embedded defaults)")
    upgrade.set_defaults(handler=_db_upgrade)

    recall = commands.add_parser("recall", help="search earlier conversations (admins)")
    recall_commands = recall.add_subparsers(dest="recall_command", required=True)
    search = recall_commands.add_parser("search", help="search one user's conversations")
    search.add_argument("query")
    search.add_argument("--user", required=True, help="the user's id")
    search.add_argument("--limit", type=int, default=10, help="results at most (10)")
    search.add_argument("--config", type=Path, help="YAML config (default: embedded defaults)")
    search.add_argument("--json", action="store_true", help="print a JSON array")
    search.set_defaults(handler=_recall_search)
    reindex = recall_commands.add_parser("reindex", help="rebuild the recall index")
    reindex.add_argument("--config", type=Path, help="YAML config (default: embedded defaults)")
    reindex.set_defaults(handler=_recall_reindex)

    add_admin_commands(commands)

    teams = commands.add_parser("teams", help="Microsoft Teams tools")
    teams_commands = teams.add_subparsers(dest="teams_command", required=True)
    package = teams_commands.add_parser("package", help="build the sideloadable Teams app zip")
    package.add_argument("--config", type=Path, required=True, help="YAML config (app id)")
    package.add_argument("--out", type=Path, required=True, help="the zip to write")
    package.add_argument("--name", default="Assistant", help="the app's short name (<= 30)")
    package.add_argument("--version", default="1.0.0", help="the app package version (semver)")
    package.set_defaults(handler=_teams_package)
    _add_email_commands(commands)
    return parser


def _add_email_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    email = commands.add_parser("email", help="email channel tools")
    email_commands = email.add_subparsers(dest="email_command", required=True)
    parse = email_commands.add_parser("parse", help="show what the gateway makes of a mail")
    parse.add_argument("file", type=Path, help="the raw mail (.eml)")
    parse.add_argument("--json", action="store_true", help="print JSON")
    parse.add_argument("--no-auth", action="store_true", help="skip sender authentication (DNS)")
    parse.add_argument("--client-ip", help="the connecting client's IP, for SPF")
    parse.add_argument("--helo", default="", help="the client's HELO name, for SPF")
    parse.add_argument("--mail-from", default="", help="the envelope sender, for SPF")
    parse.add_argument(
        "--authserv-id", help="read the verdict of this trusted MTA instead of verifying"
    )
    parse.set_defaults(handler=_email_parse)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gateway` console script."""
    args = _parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except GatewayError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_FAILURE
    return code


def _config_check(args: argparse.Namespace) -> int:
    problems = check_config(args.file)
    if not problems:
        print("ok")
        return EXIT_OK
    for problem in problems:
        print(problem)
    return EXIT_USAGE


def _config_reference(_args: argparse.Namespace) -> int:
    from gateway.config_reference import reference_markdown  # noqa: PLC0415

    print(reference_markdown(), end="")
    return EXIT_OK


def _db_upgrade(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    configure_logging(config.logging.format, config.logging.level)
    from storage.database import Database  # noqa: PLC0415  (SQLAlchemy: only when needed)

    async def upgrade() -> str | None:
        database = Database(config.storage.database_url, pool_size=config.storage.pool_size)
        try:
            await database.upgrade()
            return await database.current_revision()
        finally:
            await database.dispose()

    revision = asyncio.run(upgrade())
    print(f"database at revision {revision}")
    return EXIT_OK


def _recall_search(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    configure_logging(config.logging.format, "warning")
    import json  # noqa: PLC0415

    from sessions.recall import RecallSearch  # noqa: PLC0415
    from sessions.recall_embedding import installed_embedder  # noqa: PLC0415
    from sessions.recall_values import RecallHit  # noqa: PLC0415
    from storage.database import Database  # noqa: PLC0415
    from storage.repositories.users import UserRepository  # noqa: PLC0415
    from storage.vector_index import VectorIndex  # noqa: PLC0415

    async def search() -> list[RecallHit]:
        database = Database(config.storage.database_url, pool_size=1)
        try:
            async with database.session() as db:
                if await UserRepository(db).get(args.user) is None:
                    raise GatewayError(f"no user {args.user!r}")
            # An admin's search is the thorough one of the search tool, not a turn's bounded one.
            embedder = installed_embedder() if config.recall.dense else None
            vectors = VectorIndex(embedder) if embedder is not None else None
            return await RecallSearch(database, vectors=vectors).search(
                args.user, args.query, max(args.limit, 1), thorough=True
            )
        finally:
            await database.dispose()

    hits = asyncio.run(search())
    if args.json:
        print(json.dumps([hit.as_json() for hit in hits], indent=2, ensure_ascii=False))
        return EXIT_OK
    for hit in hits:
        who = hit.speaker if hit.kind == "turn" else "summary"
        text = " ".join(hit.text.split())
        print(f"{hit.date:%Y-%m-%d %H:%M} {hit.session_id[:8]} {who} [{hit.score:.2f}] {text}")
    return EXIT_OK


def _recall_reindex(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    configure_logging(config.logging.format, config.logging.level)
    from sessions.recall_embedding import installed_embedder  # noqa: PLC0415  (numpy: lazily)
    from storage.database import Database  # noqa: PLC0415  (SQLAlchemy: only when needed)
    from storage.recall_index import RecallIndexRepository  # noqa: PLC0415
    from storage.recall_vectors import rebuild_vectors  # noqa: PLC0415

    # Vectors whenever the model is installed: they cost little, and switching dense recall
    # on (a reload) then finds a complete index.
    embedder = installed_embedder()

    async def reindex() -> tuple[int, int]:
        database = Database(config.storage.database_url, pool_size=1)
        try:
            async with database.session() as db:
                entries = await RecallIndexRepository(db).rebuild()
                vectors = 0
                if embedder is not None:
                    vectors = await rebuild_vectors(db, embedder, on_progress=_progress_bar)
                    sys.stderr.write("\n")
                return entries, vectors
        finally:
            await database.dispose()

    entries, vectors = asyncio.run(reindex())
    print(f"recall index rebuilt: {entries} entries, {vectors} vectors")
    return EXIT_OK


def _progress_bar(done: int, total: int) -> None:
    """`[#####     ]  52% 5,200/10,000 vectors` on stderr, redrawn in place."""
    share = done / total if total else 1.0
    filled = int(share * 30)
    bar = "#" * filled + " " * (30 - filled)
    sys.stderr.write(f"\r[{bar}] {share:4.0%} {done:,}/{total:,} vectors")
    sys.stderr.flush()


def _email_parse(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415

    from channels.email.auth import Envelope  # noqa: PLC0415  (mail libraries: only here)
    from channels.email.describe import describe_email, describe_text  # noqa: PLC0415

    try:
        data = args.file.read_bytes()
    except OSError as exc:
        print(f"gateway: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILURE
    summary = describe_email(
        data,
        check_auth=not args.no_auth,
        mode="trusted_mta" if args.authserv_id else "verify",
        envelope=Envelope(client_ip=args.client_ip, helo=args.helo, mail_from=args.mail_from),
        trusted_authserv_id=args.authserv_id,
    )
    if args.json:
        print(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        print(describe_text(summary))
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    configure_logging(args.log_format or config.logging.format, config.logging.level)
    from gateway.server import serve  # noqa: PLC0415  (the server stack: only for `run`)

    if args.role == "turns" and config.storage.database_url.startswith("sqlite"):
        print("gateway: --role turns needs PostgreSQL (SQLite serves one process)", file=sys.stderr)
        return EXIT_USAGE
    if args.role == "turns":
        from storage.inbox_signal import WorkerShare  # noqa: PLC0415  (only for a worker)

        try:
            WorkerShare.configured(args.worker, config.server.turn_workers)
        except ValueError as exc:
            print(
                f"gateway: --worker: {exc} (server.turn_workers is {config.server.turn_workers})",
                file=sys.stderr,
            )
            return EXIT_USAGE
    asyncio.run(
        serve(config, args.config, role=args.role, log_format=args.log_format, worker=args.worker)
    )
    return EXIT_OK


def _teams_package(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    from channels.teams.config import TeamsChannelConfig  # noqa: PLC0415  (only for this command)
    from channels.teams.package import build_app_package  # noqa: PLC0415

    teams = config.channels.section("teams")
    if not isinstance(teams, TeamsChannelConfig):
        raise TypeError("channels.teams is not the Teams section")
    path = build_app_package(teams.app_id, args.name, args.out, version=args.version)
    print(f"Teams app package written to {path}")
    return EXIT_OK
