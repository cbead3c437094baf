"""`gateway sessions …`, `gateway users …` (over `Administration`) and `gateway doctor`.

Every command takes `--config F`; `--json` prints machine-readable JSON (the shapes of the
external contract), the default is a readable table. Deleting asks for confirmation on a
terminal unless `--yes` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from gateway.config import load_config
from gateway.log import configure_logging
from gateway.settings import parse_duration

T = TypeVar("T")
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
STATUSES = ("active", "compacting", "archived", "exported", "deleted")


def add_admin_commands(commands: Any) -> None:
    """Register `sessions`, `users` and `doctor` on the CLI's subcommand parser."""
    sessions = commands.add_parser("sessions", help="list, show, export, archive, delete sessions")
    verbs = sessions.add_subparsers(dest="sessions_command", required=True)

    listing = _command(verbs, "list", "sessions, most recently active first", _sessions_list)
    listing.add_argument("--user", help="only this user's sessions")
    listing.add_argument("--status", choices=STATUSES)
    listing.add_argument("--since", type=_duration, help="active within this long, e.g. 7d")
    listing.add_argument("--limit", type=int, default=1000)

    show = _command(verbs, "show", "one session with its messages", _sessions_show)
    show.add_argument("session_id")

    export = _command(verbs, "export", "a zip of one session or all of a user's", _export)
    _session_or_user(export)
    export.add_argument("--out", type=Path, required=True, help="the zip to write")

    remove = _command(verbs, "delete", "delete for good (rows, transcripts, index)", _delete)
    _session_or_user(remove)
    remove.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    archive = _command(verbs, "archive", "archive an active session", _sessions_archive)
    archive.add_argument("session_id")

    users = commands.add_parser("users", help="list, show, link users")
    user_verbs = users.add_subparsers(dest="users_command", required=True)
    _command(user_verbs, "list", "every user with identities", _users_list)
    user_show = _command(user_verbs, "show", "one user with identities and facts", _users_show)
    user_show.add_argument("user_id")
    link = _command(user_verbs, "link", "link a channel identity to a user", _users_link)
    link.add_argument("user_id")
    link.add_argument("channel", choices=["slack", "teams", "email", "web"])
    link.add_argument("external_id", help="Slack TEAM:USER, AAD object id, address, web id")

    doctor = commands.add_parser(
        "doctor", help="check database, transcript store, SMTP, Slack, Teams, Anthropic"
    )
    doctor.add_argument("--config", type=Path, help="YAML config (default: embedded defaults)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(handler=_doctor)


def _command(
    verbs: Any, name: str, summary: str, handler: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = verbs.add_parser(name, help=summary)
    parser.add_argument("--config", type=Path, help="YAML config (default: embedded defaults)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=handler)
    return parser


def _session_or_user(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("session_id", nargs="?")
    target.add_argument("--user", help="every session of this user")


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _with_admin(args: argparse.Namespace, work: Callable[[Any], Awaitable[T]]) -> T:
    """Open the database and transcript store of `--config`, run `work`, close them."""
    config = load_config(args.config)
    configure_logging(config.logging.format, "warning")
    # The database stack is imported only by commands that use it.
    from gateway.admin import Administration  # noqa: PLC0415
    from gateway.open_services import open_transcript_store  # noqa: PLC0415
    from storage.column_types import utcnow  # noqa: PLC0415
    from storage.database import Database  # noqa: PLC0415

    async def run() -> T:
        database = Database(config.storage.database_url, pool_size=2)
        try:
            transcripts = await asyncio.to_thread(open_transcript_store, config.storage.transcripts)
            try:
                return await work(Administration(database, transcripts, utcnow))
            finally:
                await transcripts.close()
        finally:
            await database.dispose()

    return asyncio.run(run())


def _print(args: argparse.Namespace, data: Any, table: Callable[[Any], str]) -> int:
    print(json.dumps(data, indent=2, ensure_ascii=False) if args.json else table(data))
    return EXIT_OK


def _sessions_list(args: argparse.Namespace) -> int:
    rows = _with_admin(
        args,
        lambda admin: admin.list_sessions(
            user_id=args.user, status=args.status, since=args.since, limit=args.limit
        ),
    )
    return _print(args, rows, _sessions_table)


def _sessions_show(args: argparse.Namespace) -> int:
    data = _with_admin(args, lambda admin: admin.show_session(args.session_id))
    return _print(args, data, _session_text)


def _sessions_archive(args: argparse.Namespace) -> int:
    data = _with_admin(args, lambda admin: admin.archive_session(args.session_id))
    return _print(args, data, lambda d: f"archived session {d['session_id']}")


def _export(args: argparse.Namespace) -> int:
    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty() and not args.json:
            filled = int(30 * done / max(total, 1))
            bar = "#" * filled + "." * (30 - filled)
            print(f"\rexporting [{bar}] {done}/{total}", end="", file=sys.stderr, flush=True)

    summary = _with_admin(
        args,
        lambda admin: admin.export_zip(
            args.out, session_id=args.session_id, user_id=args.user, on_progress=progress
        ),
    )
    if sys.stderr.isatty() and not args.json:
        print(file=sys.stderr)
    data = {"path": str(args.out), **summary}
    return _print(args, data, lambda d: f"wrote {d['path']} ({d['sessions']} session(s))")


def _delete(args: argparse.Namespace) -> int:
    target = f"session {args.session_id}" if args.session_id else f"user {args.user}"
    if not args.yes:
        if not sys.stdin.isatty():
            print("gateway: refusing to delete without --yes (no terminal to ask)", file=sys.stderr)
            return EXIT_USAGE
        answer = input(f"Delete {target} and everything stored about it for good? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return EXIT_FAILURE
    deletion = _with_admin(
        args,
        lambda admin: (
            admin.delete_session(args.session_id)
            if args.session_id
            else admin.delete_user(args.user)
        ),
    )
    data = {"deleted": target, **deletion.as_dict()}
    return _print(
        args,
        data,
        lambda d: (
            f"deleted {d['deleted']}: {d['sessions']} session(s), "
            f"{d['transcript_objects']} transcript object(s)"
        ),
    )


def _users_list(args: argparse.Namespace) -> int:
    return _print(args, _with_admin(args, lambda admin: admin.list_users()), _users_table)


def _users_show(args: argparse.Namespace) -> int:
    data = _with_admin(args, lambda admin: admin.show_user(args.user_id))
    return _print(args, data, lambda d: _users_table([d]) + _facts_text(d))


def _users_link(args: argparse.Namespace) -> int:
    _with_admin(
        args, lambda admin: admin.link_identity(args.user_id, args.channel, args.external_id)
    )
    data = {"user_id": args.user_id, "channel_type": args.channel, "external_id": args.external_id}
    return _print(
        args, data, lambda d: f"linked {d['channel_type']} {d['external_id']} to {d['user_id']}"
    )


def _doctor(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    configure_logging(config.logging.format, "error")
    from gateway.doctor import run_checks, table  # noqa: PLC0415

    results = asyncio.run(run_checks(config))
    _print(args, [result.as_dict() for result in results], lambda _data: table(results))
    return EXIT_FAILURE if any(result.status == "fail" for result in results) else EXIT_OK


# --- tables -------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with a header line, columns as wide as their widest cell."""
    cells = [[str(value) for value in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(value.ljust(width) for value, width in zip(values, widths, strict=True))

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _sessions_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no sessions"
    return table(
        ["SESSION", "USER", "STATUS", "MSGS", "COMPACTIONS", "LAST ACTIVE", "CHANNELS", "TOPIC"],
        [
            [
                r["session_id"],
                r["user_id"],
                r["status"],
                r["message_count"],
                r["compaction_count"],
                r["last_active"][:16].replace("T", " "),
                ",".join(sorted({c["channel_type"] for c in r["channels"]})),
                (r["topic_summary"] or "")[:40],
            ]
            for r in rows
        ],
    )


def _session_text(data: dict[str, Any]) -> str:
    head = _sessions_table([data])
    threads = [
        f"  {c['channel_type']} {c['channel_id']}"
        + (f" thread {c['thread_id']}" if c["thread_id"] else "")
        for c in data["channels"]
    ]
    compactions = [
        f"  #{c['seq']}: {c['messages_compacted']} messages, "
        f"{c['tokens_before']} → {c['tokens_after']} tokens, archive {c['archive_ref']}"
        for c in data["compactions"]
    ]
    messages = [
        f"  {m['seq']:>4} {m['created_at'][:19].replace('T', ' ')} {m['role']:<9} "
        f"[{m['channel']}] {m['content'][:200]}"
        for m in data["messages"]
    ]
    return "\n".join(
        [
            head,
            "",
            "channels:",
            *threads,
            "",
            "compactions:",
            *(compactions or ["  none"]),
            "",
            "messages:",
            *messages,
        ]
    )


def _users_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no users"
    return table(
        ["USER", "ORG", "NAME", "SESSIONS", "IDENTITIES"],
        [
            [
                r["user_id"],
                r["org_id"],
                r["name"],
                r["session_count"],
                " ".join(f"{i['channel_type']}:{i['external_id']}" for i in r["identities"]),
            ]
            for r in rows
        ],
    )


def _facts_text(data: dict[str, Any]) -> str:
    facts = data.get("memory_facts") or []
    return "\n\nmemory facts:\n" + "\n".join(f"  - {f['fact']}" for f in facts) if facts else ""
