"""The channel adapters the configuration enables, built from it.

Each channel's library is imported only when the channel is enabled (slack-bolt, botbuilder,
the mail libraries cost start-up time otherwise). `gateway.runtime` wires what these return.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from channels.base import ChannelType
from errors import GatewayError
from gateway.inbox import Inbox
from gateway.metrics import GatewayMetrics
from gateway.outbox import SentReplies
from gateway.settings import GatewayConfig
from sessions.routing import SessionThreads
from storage.database import Database

if TYPE_CHECKING:
    from channels.email.adapter import EmailChannel
    from channels.slack.adapter import SlackChannel
    from channels.teams.adapter import TeamsChannel


def open_slack(
    config: GatewayConfig, inbox: Inbox, database: Database, metrics: GatewayMetrics
) -> SlackChannel | None:
    """The Slack channel when enabled (slack-bolt is imported only then)."""
    slack = config.channels.slack
    if not slack.enabled:
        return None
    from channels.slack.adapter import SlackChannel, SlackSettings  # noqa: PLC0415

    return SlackChannel(
        SlackSettings(
            bot_token=slack.bot_token.get_secret_value(),
            signing_secret=slack.signing_secret.get_secret_value(),
            mode=slack.mode,
            app_token=slack.app_token.get_secret_value(),
            allowed_team_ids=frozenset(slack.allowed_team_ids),
            api_base_url=slack.api_base_url,
            max_text_chars=slack.max_text_chars,
        ),
        inbox,
        SessionThreads(database, ChannelType.SLACK.value),
        on_rejected=lambda status, _reason: metrics.messages_rejected.labels(
            "slack", str(status)
        ).inc(),
    )


def open_teams(
    config: GatewayConfig, inbox: Inbox, metrics: GatewayMetrics, clock: Callable[[], datetime]
) -> TeamsChannel | None:
    """The Teams channel when enabled (botbuilder is imported only then)."""
    teams = config.channels.teams
    if not teams.enabled:
        return None
    from channels.teams.adapter import TeamsChannel, TeamsSettings  # noqa: PLC0415

    return TeamsChannel(
        TeamsSettings(
            app_id=teams.app_id,
            app_password=teams.app_password.get_secret_value(),
            tenant_ids=tuple(teams.tenant_ids),
            openid_metadata_url=teams.openid_metadata_url or None,
            oauth_token_url=teams.oauth_token_url or None,
            insecure_dev_mode=teams.insecure_dev_mode,
        ),
        inbox,
        clock=clock,
        on_rejected=lambda status, _reason: metrics.messages_rejected.labels(
            "teams", str(status)
        ).inc(),
    )


async def listen_for_email(email: EmailChannel, config: GatewayConfig) -> None:
    """Start the SMTP listener; a port that cannot be bound is a `GatewayError` naming it."""
    settings = config.channels.email
    try:
        await email.start()
    except OSError as exc:
        raise GatewayError(
            f"cannot listen for email on {settings.listen_host}:{settings.listen_port} "
            f"(channels.email): {exc.strerror or exc}"
        ) from exc


def open_email(
    config: GatewayConfig,
    inbox: Inbox,
    database: Database,
    metrics: GatewayMetrics,
    clock: Callable[[], datetime],
) -> EmailChannel | None:
    """The email channel when enabled (the mail libraries are imported only then)."""
    email = config.channels.email
    if not email.enabled:
        return None
    from channels.email.adapter import EmailChannel, EmailSettings  # noqa: PLC0415

    outbound = email.outbound
    return EmailChannel(
        EmailSettings(
            addresses=tuple(email.addresses),
            listen_host=email.listen_host,
            listen_port=email.listen_port,
            max_message_bytes=email.max_message_bytes,
            auth_mode=email.auth.mode,
            trusted_authserv_id=email.auth.trusted_authserv_id,
            outbound_host=outbound.host,
            outbound_port=outbound.port,
            outbound_starttls=outbound.starttls,
            outbound_username=outbound.username,
            outbound_password=outbound.password.get_secret_value(),
            tls_cert=email.tls_cert,
            tls_key=email.tls_key,
            replies_per_sender_per_hour=email.replies_per_sender_per_hour,
        ),
        inbox,
        clock=clock,
        sent=SentReplies(database, ChannelType.EMAIL),
        on_rejected=lambda status, _reason: metrics.messages_rejected.labels(
            "email", str(status)
        ).inc(),
    )
