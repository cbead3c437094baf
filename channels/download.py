"""Bounded downloads of the files a platform keeps (Slack, Teams): the half of
`channels.files.FileChannel.fetch_attachment` that does not depend on the platform.

`FileHosts` names the hosts a platform serves its files from; `download` GETs a file from one
of them and gives up with an `AttachmentError` (whose reason the user reads) when

- the URL, or a redirect, leaves those hosts: no request is ever made to a foreign host, so a
  URL taken from a payload cannot send the bot's credentials, or the gateway, elsewhere;
- the answer declares (`Content-Length`), or turns out to hold, more than `max_bytes`;
- the platform answers with an HTTP error, or cannot be reached.

`time_limit` bounds a whole fetch (lookups and redirects included) in time, since a server
that trickles a byte now and then never trips a per-read timeout.

Only https is spoken, except to a loopback address (127.0.0.0/8, ::1, localhost), where the
fake platforms the tests run listen in plain http and nothing sent crosses a network. A
loopback host is fetched from only when configuration allows it like any other host (Slack's
`api_base_url`, Teams' `file_hosts`). Credentials (`headers`) go only to the origin the
download starts at; a redirect to another allowed origin is followed without them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from channels.files import AttachmentError, size_text, too_large
from primitives.config_types import is_loopback

MAX_REDIRECTS = 5
DOWNLOAD_TIMEOUT = 30.0  # seconds for a whole fetch, unless a channel says otherwise


@dataclass(frozen=True, slots=True)
class FileHosts:
    """The hosts a platform's files are served from: `files.slack.com` names one host,
    `*.sharepoint.com` any host under that domain (not the domain itself)."""

    patterns: tuple[str, ...]

    @classmethod
    def of(cls, patterns: Iterable[str]) -> FileHosts:
        """Hosts from patterns in any case, with or without a trailing dot; blanks are dropped."""
        cleaned = (pattern.strip().lower().rstrip(".") for pattern in patterns)
        return cls(tuple(pattern for pattern in cleaned if pattern))

    def __add__(self, other: FileHosts) -> FileHosts:
        return FileHosts(self.patterns + other.patterns)

    def allows(self, host: str) -> bool:
        """Whether `host` is one of these hosts."""
        host = host.lower().rstrip(".")
        return any(
            host.endswith(pattern[1:]) if pattern.startswith("*.") else host == pattern
            for pattern in self.patterns
        )

    def refusal(self, url: httpx.URL, platform: str) -> str | None:
        """Why `url` may not be fetched (the reason the user reads), or None when it may."""
        if url.scheme not in ("https", "http") or not url.host:
            return "it has no web address I can use"
        if not self.allows(url.host):
            return f"it is not on a {platform} file server"
        if url.scheme == "http" and not is_loopback(url.host.lower().rstrip(".")):
            return f"{platform} offered it over an unencrypted connection"
        return None


@dataclass(frozen=True, slots=True)
class Downloaded:
    """A file's bytes and the media type its server declared (lower case, no parameters)."""

    content: bytes
    media_type: str


def url_of(value: object) -> httpx.URL | None:
    """`value` as a URL, or None when it is not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return httpx.URL(value)
    except httpx.InvalidURL:
        return None


@asynccontextmanager
async def time_limit(seconds: float, platform: str) -> AsyncIterator[None]:
    """Run the block for at most `seconds`; past that, `AttachmentError`."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError as exc:
        raise AttachmentError(
            f"{platform} took longer than {seconds:g} seconds to send it"
        ) from exc


async def download(
    http: httpx.AsyncClient,
    url: httpx.URL,
    *,
    hosts: FileHosts,
    platform: str,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
) -> Downloaded:
    """The file at `url`, following at most `MAX_REDIRECTS` redirects within `hosts`.

    Raises `AttachmentError` for every expected failure (see the module docstring); callers
    bound it in time with `time_limit`.
    """
    origin = _origin(url)
    for _ in range(MAX_REDIRECTS + 1):
        reason = hosts.refusal(url, platform)
        if reason is not None:
            raise AttachmentError(reason)
        sent = dict(headers or {}) if _origin(url) == origin else {}
        try:
            async with http.stream("GET", url, headers=sent, follow_redirects=False) as response:
                if response.is_redirect:
                    url = response.url.join(response.headers["location"])
                    continue
                return await _body(response, platform, max_bytes)
        except httpx.TimeoutException as exc:
            raise AttachmentError(f"{platform} took too long to answer") from exc
        except httpx.HTTPError as exc:
            raise AttachmentError(f"the {platform} file server could not be reached") from exc
        except httpx.InvalidURL as exc:
            raise AttachmentError(f"{platform} redirected to an unusable address") from exc
    raise AttachmentError(f"{platform} redirected the download too many times")


async def _body(response: httpx.Response, platform: str, max_bytes: int) -> Downloaded:
    status = response.status_code
    if status >= 500:
        raise AttachmentError(f"{platform} could not send the file ({status})")
    if status >= 300:
        raise AttachmentError(f"{platform} refused the download ({status})")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large(int(declared), max_bytes)
    chunks: list[bytes] = []
    received = 0
    async for chunk in response.aiter_bytes():
        received += len(chunk)
        if received > max_bytes:
            raise AttachmentError(f"too large (more than the limit of {size_text(max_bytes)})")
        chunks.append(chunk)
    media_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    return Downloaded(b"".join(chunks), media_type)


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host.lower(), url.port
