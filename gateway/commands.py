"""Chat commands, the same on every channel: `/new`, `/sessions`, `/resume`, `/status`,
`/export`, `/forget`, `/tools`, `/help` (also written with `!`; on email the subject or first line).

A command is answered by the gateway itself; it never reaches the model or the transcript.
A user's session spans their direct messages and the shared conversations they mention the
assistant in, so what a command shows depends on where it was asked (`is_private_conversation`):
an export is made only in a private conversation, and `/sessions` and `/status` leave out
topics and the list of channels in shared ones, where others read the reply.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from channels.base import ChannelMessage, FileToSend
from channels.registry import channel_plugin
from gateway.identity import ResolvedUser
from gateway.log import get_logger
from sessions.actions import (
    SessionView,
    current_session,
    forget_session,
    list_sessions,
    resume_session,
    session_channels,
    session_export,
    sessions_by_prefix,
    start_new_session,
)
from sessions.routing import Arrival, RoutingPolicy
from sessions.toolbox import McpToolbox
from storage.repositories.export_links import ExportLinkRepository
from storage.transcripts import TranscriptStore

log = get_logger(__name__)

# A command word is followed by a space or the end: "/etc/hosts is gone" and "!Note: …" are
# ordinary messages.
COMMAND_PATTERN = re.compile(r"^\s*[/!](?P<name>[a-zA-Z]+)(?=\s|$)(?P<args>[^\n]*)")
FORGET_CONFIRMATION_WINDOW = timedelta(minutes=5)
MIN_ID_PREFIX = 4

HELP_TEXT = """Commands (also written with ! instead of /):
/new: close this session and start a fresh one
/sessions: list your recent sessions
/resume <id>: continue an earlier session (the first characters of its id are enough)
/status: this session's id, channels, messages, context use and compactions
/export [id]: in a direct message, a download link (valid 24 hours) with everything
  stored about a session
/forget: delete this session for good (asks for confirmation)
/tools: the tools the assistant may use for you
/help: this list"""

EXPORT_LINK_LIFETIME = timedelta(hours=24)
EXPORT_ONLY_IN_PRIVATE = (
    "Exports hold your whole conversation, so I only send them in a direct message. "
    "Send /export to me in a DM."
)


@dataclass(frozen=True, slots=True)
class Command:
    """A parsed chat command."""

    name: str
    args: str


@dataclass(frozen=True, slots=True)
class CommandOutcome:
    """The reply to a command, the session it concerns (if any) and a file to send with it."""

    reply: str
    session_id: str | None = None
    file: FileToSend | None = None


def parse_command(message: ChannelMessage) -> Command | None:
    """The command in the message's first line (or an email's subject), if there is one."""
    candidates = [message.content]
    if message.subject:
        candidates.insert(
            0, re.sub(r"^\s*((re|fwd?|aw|wg)\s*:\s*)+", "", message.subject, flags=re.I)
        )
    for text in candidates:
        match = COMMAND_PATTERN.match(text)
        if match:
            return Command(match["name"].lower(), match["args"].strip())
    return None


def is_private_conversation(message: ChannelMessage) -> bool:
    """Whether only the sender reads the replies to `message` (its channel's parser says so:
    a Slack DM, a Teams personal chat, email, the web). Anything not known to be private counts
    as shared, so a new conversation kind shows others nothing of the user's DMs."""
    return message.is_private


def short_id(session_id: str) -> str:
    """The first eight characters of a session id: enough for people to tell sessions apart."""
    return session_id[:8]


@dataclass
class CommandContext:
    """What a command needs to run inside the turn's transaction."""

    db: AsyncSession
    user: ResolvedUser
    arrival: Arrival
    message: ChannelMessage
    policy: RoutingPolicy
    history_budget_tokens: int
    now: datetime
    transcripts: TranscriptStore
    public_url: str = ""
    # The MCP servers' tools (None: no toolbox in this process).
    tools: McpToolbox | None = None


async def run_command(command: Command, context: CommandContext) -> CommandOutcome:
    """Execute a command for the message's sender and return the reply."""
    handlers = {
        "help": _help,
        "new": _new,
        "sessions": _sessions,
        "resume": _resume,
        "status": _status,
        "forget": _forget,
        "export": _export,
        "tools": _tools,
    }
    handler = handlers.get(command.name)
    if handler is None:
        return CommandOutcome(f"Unknown command /{command.name}. Send /help for the list.")
    log.info("command.run", command=command.name, user_id=context.user.user_id)
    return await handler(command, context)


async def _current(context: CommandContext) -> SessionView | None:
    return await current_session(context.db, context.arrival, context.policy, now=context.now)


async def _help(_command: Command, _context: CommandContext) -> CommandOutcome:
    return CommandOutcome(HELP_TEXT)


async def _new(_command: Command, context: CommandContext) -> CommandOutcome:
    created, previous = await start_new_session(
        context.db, context.arrival, context.policy, now=context.now
    )
    if previous is None:
        return CommandOutcome(f"Started a new session ({short_id(created.id)}).", created.id)
    return CommandOutcome(
        f"Started a new session ({short_id(created.id)}). The previous one "
        f"({short_id(previous.id)}, {previous.message_count} messages) is archived; "
        f"/resume {short_id(previous.id)} brings it back.",
        created.id,
    )


async def _sessions(_command: Command, context: CommandContext) -> CommandOutcome:
    recent = await list_sessions(context.db, context.user.user_id, limit=10)
    if not recent:
        return CommandOutcome("You have no sessions yet.")
    current = await _current(context)
    # Topics are summaries of what was said, DMs included: not for a shared conversation.
    private = is_private_conversation(context.message)
    lines = ["Your recent sessions:"]
    for item in recent:
        marker = "*" if current is not None and item.id == current.id else " "
        topic = f"  {item.topic_summary or '(no topic yet)'}" if private else ""
        lines.append(
            f"{marker} {short_id(item.id)}  {item.last_active_at:%Y-%m-%d %H:%M}  "
            f"{item.status:<8}  {item.message_count:>4} msgs{topic}"
        )
    if not private:
        lines.append("Topics are shown only in a direct message.")
    lines.append("/resume <id> continues one.")
    return CommandOutcome("\n".join(lines), current.id if current else None)


async def _resume(command: Command, context: CommandContext) -> CommandOutcome:
    prefix = command.args.split()[0] if command.args.split() else ""
    if len(prefix) < MIN_ID_PREFIX:
        return CommandOutcome(
            f"Say which session: /resume <id>, with at least {MIN_ID_PREFIX} characters "
            "of its id (see /sessions)."
        )
    resumed = await resume_session(
        context.db, context.arrival, context.policy, prefix, now=context.now
    )
    if resumed.outcome == "not_found":
        return CommandOutcome(f"You have no session starting with {prefix!r}; see /sessions.")
    if resumed.outcome == "ambiguous" or resumed.session is None:
        return CommandOutcome(
            f"{prefix!r} matches {resumed.matches} sessions; give more of the id."
        )
    target = resumed.session
    return CommandOutcome(
        f"Resumed session {short_id(target.id)} ({target.message_count} messages, "
        f"started {target.created_at:%Y-%m-%d %H:%M} UTC).",
        target.id,
    )


async def _tools(_command: Command, context: CommandContext) -> CommandOutcome:
    """The tools the user may use now, one a line, with what each does."""
    user = context.user
    offered = context.tools.offered(user.org_id, user.user_id) if context.tools else ()
    if not offered:
        return CommandOutcome("No tools are available to you.")
    lines = [f"Tools I may use for you ({len(offered)}):"]
    for tool in offered:
        description = " ".join(tool.tool.description.split())
        if len(description) > 120:
            description = description[:119] + "…"
        confirm = " (asks you first)" if tool.tool.confirm else ""
        lines.append(f"- {tool.name}{confirm}" + (f": {description}" if description else ""))
    return CommandOutcome("\n".join(lines))


async def _status(_command: Command, context: CommandContext) -> CommandOutcome:
    current = await _current(context)
    if current is None:
        return CommandOutcome("No active session: your next message starts one.")
    channels = await session_channels(context.db, current.id)
    if channels and not is_private_conversation(context.message):
        # Where else the user talks (their DMs, other channels) is not for this audience.
        places = f"{len(channels)} (listed only in a direct message)"
    else:
        places = ", ".join(
            f"{channel.channel_type}:{channel.channel_id}"
            + (f" (thread {channel.thread_id})" if channel.thread_id else "")
            for channel in channels
        )
    used = current.context_tokens
    budget = context.history_budget_tokens
    return CommandOutcome(
        "\n".join(
            [
                f"Session {current.id} ({current.status})",
                f"Started {current.created_at:%Y-%m-%d %H:%M} UTC, "
                f"last active {current.last_active_at:%Y-%m-%d %H:%M} UTC",
                f"Channels: {places or 'none yet'}",
                f"Messages: {current.message_count} ({current.user_message_count} from you, "
                f"{current.assistant_message_count} from the assistant)",
                f"Context use: {used} of {budget} tokens ({100 * used // budget}%)",
                f"Compactions: {current.compaction_count}",
            ]
        ),
        current.id,
    )


async def _forget(command: Command, context: CommandContext) -> CommandOutcome:
    forgotten = await forget_session(
        context.db,
        context.arrival,
        context.policy,
        confirming=command.args.lower().startswith(("confirm", "yes")),
        now=context.now,
        window=FORGET_CONFIRMATION_WINDOW,
        transcripts=context.transcripts,
    )
    session = forgotten.session
    if forgotten.outcome == "no_session":
        return CommandOutcome("There is no active session to forget.")
    if forgotten.outcome == "confirm" and session is not None:
        return CommandOutcome(
            f"This permanently deletes session {short_id(session.id)} and its "
            f"{session.message_count} messages. Send /forget confirm within 5 minutes to go ahead.",
            session.id,
        )
    if forgotten.outcome == "deleted" and session is not None:
        return CommandOutcome(
            f"Deleted session {short_id(session.id)} and everything in it. "
            "Your next message starts a new session."
        )
    return CommandOutcome("Nothing to confirm: send /forget first, then /forget confirm.")


def export_token_hash(token: str) -> str:
    """What is stored of an export link's token: its SHA-256, so a database leak leaks no link."""
    return hashlib.sha256(token.encode()).hexdigest()


async def _export(command: Command, context: CommandContext) -> CommandOutcome:
    message = context.message
    if not is_private_conversation(message):
        # The file and the link (a bearer link) would reach everyone in the conversation,
        # and the session holds the user's DMs too: refused before anything is made.
        log.info(
            "export.refused",
            reason="shared conversation",
            user_id=context.user.user_id,
            channel=message.channel_type.value,
            channel_id=message.channel_id,
        )
        return CommandOutcome(EXPORT_ONLY_IN_PRIVATE)
    target = await _current(context)
    prefix = command.args.split()[0] if command.args.split() else ""
    if prefix:
        matches = await sessions_by_prefix(context.db, context.user.user_id, prefix)
        if len(matches) != 1:
            return CommandOutcome(
                f"{prefix!r} does not name exactly one of your sessions; see /sessions."
            )
        target = matches[0]
    if target is None:
        return CommandOutcome("There is no session to export yet.")
    token = secrets.token_urlsafe(32)
    await ExportLinkRepository(context.db).create(
        export_token_hash(token),
        user_id=context.user.user_id,
        session_id=target.id,
        at=context.now,
        expires_at=context.now + EXPORT_LINK_LIFETIME,
    )
    link = f"{context.public_url.rstrip('/')}/web/v1/exports/{token}"
    log.info("export.link_created", session_id=target.id, user_id=context.user.user_id)
    summary = f"Your export of session {short_id(target.id)} ({target.message_count} messages)"
    if not channel_plugin(context.message.channel_type).delivers_files:
        return CommandOutcome(f"{summary} is ready for 24 hours: {link}", target.id)
    data = await session_export(context.db, target.id)
    if data is None:
        return CommandOutcome("There is no session to export yet.")
    attached = FileToSend(
        filename=f"session-{short_id(target.id)}.json",
        content_type="application/json",
        content=json.dumps(data, indent=2, ensure_ascii=False),
    )
    return CommandOutcome(
        f"{summary} is attached; it is also available for 24 hours at {link}",
        target.id,
        attached,
    )
