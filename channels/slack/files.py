"""The files people send on Slack, fetched when the turn runs (`SlackChannel.fetch_attachment`).

The parser (`parse.py`) puts in each attachment's `source` the file's id, its download URL and
what it knows of where the file lives; `SlackFiles.fetch` then

- refuses a file Slack does not host (`is_external` / `external_type`: a Google Drive or
  Dropbox link), which the bot's token cannot open;
- looks up a file the event only names (`file_access: check_file_info`, as Slack Connect
  events do) with `files.info`, which says whether the bot may have it and where it is;
- downloads it with the bot token (`files:read`) from `files.slack.com`, or from the host of
  `api_base_url` (a fake Slack in tests), within the size and time limit.

Slack answers a download it does not authorise with its sign-in page (200, HTML) rather than
an HTTP error; an HTML answer for a file that is not HTML is refused as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import httpx
import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import Attachment
from channels.download import DOWNLOAD_TIMEOUT, FileHosts, download, time_limit, url_of
from channels.files import AttachmentError, too_large
from channels.slack.parse import file_size, file_source
from channels.slack.refusals import error_code

log = structlog.stdlib.get_logger(__name__)

SLACK_FILE_HOST = "files.slack.com"
PLATFORM = "Slack"


def slack_file_hosts(api_base_url: str) -> FileHosts:
    """`files.slack.com`, and the host of the configured Web API (tests point it at a fake)."""
    api = url_of(api_base_url)
    return FileHosts.of((SLACK_FILE_HOST, api.host if api is not None else ""))


class SlackFiles:
    """Downloads Slack files with the bot token; every refusal is an `AttachmentError`,
    logged as `slack.file_refused`."""

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        bot_token: str,
        api_base_url: str,
        timeout: float = DOWNLOAD_TIMEOUT,
    ) -> None:
        self.client = client
        self.hosts = slack_file_hosts(api_base_url)
        self.timeout = timeout
        self._token = bot_token
        self._http = httpx.AsyncClient(timeout=timeout)

    async def fetch(self, attachment: Attachment, *, max_bytes: int) -> bytes:
        """The file's bytes; raises `AttachmentError` with the reason the user reads."""
        try:
            async with time_limit(self.timeout, PLATFORM):
                return await self._fetch(attachment, max_bytes)
        except AttachmentError as exc:
            log.warning(
                "slack.file_refused",
                file=attachment.source.get("slack_file"),
                filename=attachment.filename,
                reason=exc.reason,
            )
            raise

    async def close(self) -> None:
        """Close the download connections."""
        await self._http.aclose()

    async def _fetch(self, attachment: Attachment, max_bytes: int) -> bytes:
        source: Mapping[str, Any] = attachment.source
        if not source.get("slack_file") and not source.get("download"):
            raise AttachmentError("Slack did not say where the file is")
        size = attachment.size
        if source.get("lookup"):
            item = await self._look_up(str(source.get("slack_file") or ""))
            source, size = file_source(item), max(size, file_size(item))
        if source.get("external"):
            raise AttachmentError("it is stored outside Slack, where I cannot open it")
        if size > max_bytes:
            raise too_large(size, max_bytes)
        url = url_of(source.get("download"))
        if url is None:
            raise AttachmentError("Slack did not say where the file is")
        fetched = await download(
            self._http,
            url,
            hosts=self.hosts,
            platform=PLATFORM,
            max_bytes=max_bytes,
            headers={"Authorization": f"Bearer {self._token}"},
        )
        if fetched.media_type == "text/html" and attachment.content_type != "text/html":
            raise AttachmentError("Slack sent its sign-in page instead: it refused the bot access")
        return fetched.content

    async def _look_up(self, file_id: str) -> Mapping[str, Any]:
        """The file object from `files.info` (Slack Connect events carry only its id)."""
        try:
            answer = await self.client.files_info(file=file_id)
        except SlackApiError as exc:
            raise AttachmentError(f"Slack refused to share it ({error_code(exc)})") from exc
        except aiohttp.ClientError as exc:
            raise AttachmentError("Slack could not be reached") from exc
        item = answer.get("file")
        if not isinstance(item, Mapping):
            raise AttachmentError("Slack did not say where the file is")
        return item
