"""The email channel as the gateway plugs it in (see `channels.plugin`); the mail libraries
are imported only when the channel is opened."""

from __future__ import annotations

from typing import TYPE_CHECKING

from channels.base import ChannelType
from channels.email.config import EmailChannelConfig
from channels.plugin import ChannelAdapter, ChannelPlugin, ChannelServices, DoctorCheck

if TYPE_CHECKING:
    from channels.email.adapter import EmailSettings


def settings_of(section: EmailChannelConfig) -> EmailSettings:
    """The adapter's settings from its config section."""
    from channels.email.adapter import EmailSettings  # noqa: PLC0415

    outbound = section.outbound
    return EmailSettings(
        addresses=tuple(section.addresses),
        listen_host=section.listen_host,
        listen_port=section.listen_port,
        max_message_bytes=section.max_message_bytes,
        auth_mode=section.auth.mode,
        trusted_authserv_id=section.auth.trusted_authserv_id,
        outbound_host=outbound.host,
        outbound_port=outbound.port,
        outbound_starttls=outbound.starttls,
        outbound_username=outbound.username,
        outbound_password=outbound.password.get_secret_value(),
        tls_cert=section.tls_cert,
        tls_key=section.tls_key,
        replies_per_sender_per_hour=section.replies_per_sender_per_hour,
        outbound_mode=outbound.mode,
        outbound_directory=outbound.directory,
    )


def open_email(settings: EmailSettings, services: ChannelServices) -> ChannelAdapter:
    """The email channel; `start` binds its SMTP listener."""
    from channels.email.adapter import EmailChannel  # noqa: PLC0415

    return EmailChannel(
        settings,
        services.inbox,
        clock=services.clock,
        sent=services.sent,
        on_rejected=services.on_rejected,
        files=services.files,
    )


async def check_smtp(section: EmailChannelConfig) -> str:
    """The outbound SMTP server greets us (and accepts the login, when one is configured); in
    files mode, the folder that receives replies can be created and written to."""
    outbound = section.outbound
    if outbound.mode == "files":
        from channels.email.outbound import ReplyFolder  # noqa: PLC0415

        return await ReplyFolder(outbound.directory).check()
    import aiosmtplib  # noqa: PLC0415

    client = aiosmtplib.SMTP(
        hostname=outbound.host, port=outbound.port, start_tls=outbound.starttls or None
    )
    async with client:
        if outbound.username:
            await client.login(outbound.username, outbound.password.get_secret_value())
        return f"{outbound.host}:{outbound.port} {(client.esmtp_extensions and 'ESMTP') or 'SMTP'}"


PLUGIN: ChannelPlugin[EmailChannelConfig, EmailSettings] = ChannelPlugin(
    channel_type=ChannelType.EMAIL,
    config_model=EmailChannelConfig,
    settings_of=settings_of,
    open=open_email,
    # The listener's address and TLS are bound when it starts; the rest is read per mail.
    reloadable=frozenset(
        {"addresses", "auth", "outbound", "max_message_bytes", "replies_per_sender_per_hour"}
    ),
    restart_only=frozenset({"listen_host", "listen_port", "tls_cert", "tls_key"}),
    delivers_files=True,
    doctor=(DoctorCheck("smtp (outbound)", check_smtp),),
    title="email",
)
