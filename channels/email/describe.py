"""What the gateway would make of one mail, for admins (``gateway email parse FILE.eml``).

`describe_email` runs the same parser and (unless skipped) the same sender authentication as
the SMTP server, and returns a JSON-ready summary; bad mail raises `ChannelPayloadError` with
the reason.
"""

from __future__ import annotations

from typing import Any

from channels.email.auth import AuthMode, Envelope, Resolver, authenticate, dns_resolver
from channels.email.parse import parse_email


def describe_email(
    data: bytes,
    *,
    check_auth: bool = True,
    mode: AuthMode = "verify",
    envelope: Envelope | None = None,
    trusted_authserv_id: str | None = None,
    resolver: Resolver = dns_resolver,
) -> dict[str, Any]:
    """The routed message's fields plus the authentication verdict (``{"skipped": true}``
    without `check_auth`). Raises `ChannelPayloadError` for mail that cannot be routed."""
    message = parse_email(data)
    headers = message.raw.get("headers", {})
    forwarded = message.forwarded
    verdict: dict[str, Any] = {"skipped": True}
    if check_auth:
        verdict = authenticate(
            data,
            mode=mode,
            envelope=envelope or Envelope(),
            resolver=resolver,
            trusted_authserv_id=trusted_authserv_id,
        ).to_dict()
    return {
        "message_id": message.message_id,
        "thread_id": message.thread_id,
        "in_reply_to": headers.get("in_reply_to", []),
        "references": list(message.references),
        "from": {
            "address": message.user_identifier,
            "name": message.reply_context.get("reply_to_name", ""),
        },
        "to": message.channel_id,
        "subject": message.reply_context.get("subject", ""),
        "date": headers.get("date") or None,
        "content": message.content,
        "forwarded": None
        if forwarded is None
        else {
            "from": {"address": forwarded.sender, "name": forwarded.sender_name},
            "subject": forwarded.subject,
            "date": forwarded.date,
            "body": forwarded.body,
        },
        "attachments": [
            {"filename": item.filename, "content_type": item.content_type, "size": item.size}
            for item in message.attachments
        ],
        "size": message.raw.get("size"),
        "defects": message.raw.get("defects", []),
        "auth": verdict,
    }


def describe_text(summary: dict[str, Any]) -> str:
    """The summary as a few readable lines."""
    sender = summary["from"]
    lines = [
        f"From:        {sender['name']} <{sender['address']}>",
        f"To:          {summary['to']}",
        f"Subject:     {summary['subject']}",
        f"Message-ID:  {summary['message_id']}",
        f"Thread:      {summary['thread_id']}",
        f"References:  {', '.join(summary['references']) or '-'}",
        f"Auth:        {summary['auth'].get('reason', 'skipped')}",
        "",
        summary["content"],
    ]
    forwarded = summary["forwarded"]
    if forwarded:
        lines += [
            "",
            f"--- forwarded from {forwarded['from']['name']} <{forwarded['from']['address']}>",
            f"Subject: {forwarded['subject']}",
            f"Date: {forwarded['date']}",
            "",
            forwarded["body"],
        ]
    for item in summary["attachments"]:
        lines.append(f"[attachment] {item['filename']} ({item['content_type']}, {item['size']} B)")
    return "\n".join(lines)
