"""The files people send in Teams, fetched when the turn runs (`TeamsChannel.fetch_attachment`).

The parser (`parse.py`) marks two kinds in `Attachment.source`:

- `teams_download`: a file shared from OneDrive or SharePoint (`file.download.info`). Its
  `downloadUrl` is pre-authenticated and short-lived, so it is fetched without the bot's
  token, and only from Microsoft's file hosts (`MICROSOFT_FILE_HOSTS`).
- `teams_content`: an inline image or pasted screenshot. Its `contentUrl` is served by the
  Bot Connector under the activity's service URL and needs the bot's token, which therefore
  goes only to that service URL's host.

`file_hosts` (`channels.teams.file_hosts`) adds hosts to both, for fakes in tests and for
clouds whose hosts are not listed here. The service URL of an activity is trusted because its
JWT names it (`serviceurl` claim); in `insecure_dev_mode` nothing was verified, so there only
`file_hosts` count and the bot's token never follows a URL an unverified payload chose.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import structlog

from channels.base import Attachment
from channels.download import DOWNLOAD_TIMEOUT, FileHosts, download, time_limit, url_of
from channels.files import AttachmentError, too_large
from channels.teams.auth import BotCredentials
from errors import DeliveryError

log = structlog.stdlib.get_logger(__name__)

PLATFORM = "Teams"
MICROSOFT_FILE_HOSTS = FileHosts.of(
    (
        "*.sharepoint.com",
        "*.sharepoint-df.com",
        "*.onedrive.com",
        "*.1drv.com",
        "*.files.1drv.com",
        "*.livefilestore.com",
    )
)


class TeamsFiles:
    """Downloads Teams files (shared files without a token, inline images with the bot's);
    every refusal is an `AttachmentError`, logged as `teams.file_refused`."""

    def __init__(
        self,
        credentials: BotCredentials,
        http: httpx.AsyncClient,
        *,
        file_hosts: tuple[str, ...] = (),
        trust_service_url: bool = True,
        timeout: float = DOWNLOAD_TIMEOUT,
    ) -> None:
        self.credentials = credentials
        self.file_hosts = file_hosts
        self.trust_service_url = trust_service_url
        self.timeout = timeout
        self._http = http

    async def fetch(self, attachment: Attachment, *, max_bytes: int) -> bytes:
        """The file's bytes; raises `AttachmentError` with the reason the user reads."""
        try:
            if attachment.size > max_bytes:
                raise too_large(attachment.size, max_bytes)
            async with time_limit(self.timeout, PLATFORM):
                return await self._fetch(attachment.source, max_bytes)
        except AttachmentError as exc:
            log.warning(
                "teams.file_refused",
                filename=attachment.filename,
                kind=_kind(attachment.source),
                # The host only: a download URL carries its access token in the query.
                host=_host(attachment.source),
                reason=exc.reason,
            )
            raise

    async def _fetch(self, source: Mapping[str, Any], max_bytes: int) -> bytes:
        configured = FileHosts.of(self.file_hosts)
        if "teams_download" in source:
            url = _url(source["teams_download"])
            hosts = MICROSOFT_FILE_HOSTS + configured
            fetched = await download(
                self._http, url, hosts=hosts, platform=PLATFORM, max_bytes=max_bytes
            )
            return fetched.content
        if "teams_content" in source:
            url = _url(source["teams_content"])
            service = url_of(source.get("service_url"))
            trusted = (service.host,) if service is not None and self.trust_service_url else ()
            hosts = FileHosts.of(trusted) + configured
            reason = hosts.refusal(url, PLATFORM)  # checked before a token is fetched for it
            if reason is not None:
                raise AttachmentError(reason)
            fetched = await download(
                self._http,
                url,
                hosts=hosts,
                platform=PLATFORM,
                max_bytes=max_bytes,
                headers=await self._authorization(),
            )
            return fetched.content
        raise AttachmentError("Teams does not let bots download this kind of attachment")

    async def _authorization(self) -> dict[str, str]:
        """The bot's bearer token for the Bot Connector (none in development without an app
        password, where the connector is called without one too)."""
        if not self.credentials.uses_token:
            return {}
        try:
            await self.credentials.refresh()
            return {"Authorization": f"Bearer {self.credentials.get_access_token()}"}
        except DeliveryError as exc:
            raise AttachmentError("the bot could not sign in to Teams to fetch it") from exc


def _url(value: object) -> httpx.URL:
    url = url_of(value)
    if url is None:
        raise AttachmentError("it has no web address I can use")
    return url


def _kind(source: Mapping[str, Any]) -> str:
    return next((kind for kind in ("teams_download", "teams_content") if kind in source), "")


def _host(source: Mapping[str, Any]) -> str:
    url = url_of(source.get(_kind(source))) if _kind(source) else None
    return url.host if url is not None else ""
