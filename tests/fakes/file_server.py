"""How the fake platforms (`slack_api`, `bot_framework`) serve a file: its bytes with their
length, or streamed without one (`chunked`), or a byte every tenth of a second for as long as
the client listens (`trickle`), or a redirect, or an HTTP error instead."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.responses import RedirectResponse, Response, StreamingResponse


@dataclass
class ServedFile:
    """A file a fake platform holds, and how it answers a download."""

    name: str
    content: bytes
    media_type: str = "application/octet-stream"
    chunked: bool = False
    trickle: bool = False
    redirect: str | None = None
    status: int = 200


def file_response(served: ServedFile) -> Response:
    """The answer to an authorised download of `served`."""
    if served.redirect is not None:
        return RedirectResponse(served.redirect, status_code=302)
    if served.status != 200:
        return Response(b"no", status_code=served.status, media_type="text/plain")
    if served.trickle:
        return StreamingResponse(_trickle(), media_type=served.media_type)
    if served.chunked:
        return StreamingResponse(_chunks(served.content), media_type=served.media_type)
    return Response(served.content, media_type=served.media_type)


async def _chunks(content: bytes, size: int = 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(content), size):
        yield content[start : start + size]


async def _trickle() -> AsyncIterator[bytes]:
    while True:  # starlette stops it when the client disconnects
        yield b"."
        await asyncio.sleep(0.1)
