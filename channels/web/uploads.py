"""Files sent with a web message: `POST /web/v1/messages` as `multipart/form-data`.

The form has the JSON body's fields as text parts (`text`, `user`, `thread_id`, `message_id`)
and one `files` part per file. It is read within the files limits (`channels.files.FileLimits`):
a body larger than one message's files may be together (and its text) is refused as declared,
or as soon as that much has arrived, so nothing unbounded is read or spooled to disk; then each
file against the per-file limit, the count and the total. Refusals are `RejectedRequestError`s
(413) whose reason names the file and the limit ("report.pdf is too large (42 MB, limit
25 MB)"). The accepted files' bytes go into the gateway's stash (`channels.files.FileStash`)
one at a time, before the message is accepted, and the attachments name their keys.
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
import re
import unicodedata
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import structlog
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.types import Message, Receive

from channels.base import Attachment, ChannelMessage
from channels.files import STASH_KEY, FileLimits, FileStash, size_text, too_large
from channels.web.parse import parse_web_message
from errors import ChannelPayloadError, RejectedRequestError, StorageError

log = structlog.stdlib.get_logger(__name__)

FILES_FIELD = "files"
TEXT_FIELDS = ("user", "text", "thread_id", "message_id")
# The multipart framing (boundaries, part headers, file names) beside the bytes it carries.
FRAMING_BYTES = 64 * 1024
MAX_NAME_CHARS = 200
UNNAMED = "file"
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,126}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}")
_PATH_SEPARATORS = re.compile(r"[/\\]")


@dataclass(frozen=True, slots=True)
class Upload:
    """A read form: its text fields, and each file as its attachment (not yet stashed) with
    the spooled bytes."""

    fields: Mapping[str, str]
    files: tuple[tuple[Attachment, UploadFile], ...] = ()

    @property
    def attachments(self) -> tuple[Attachment, ...]:
        """The files' names, types and sizes."""
        return tuple(attachment for attachment, _ in self.files)

    async def stash(self, stash: FileStash) -> tuple[Attachment, ...]:
        """Each file's bytes put in `stash`, one at a time: the attachments naming their
        keys. Raises `StorageError`, with what was already put discarded."""
        stashed: list[Attachment] = []
        try:
            for attachment, upload in self.files:
                key = await stash.put(await upload.read())
                stashed.append(dataclasses.replace(attachment, source={STASH_KEY: key}))
        except StorageError:
            await discard(stashed, stash)
            raise
        return tuple(stashed)


async def upload_message(
    request: Request,
    stash: FileStash | None,
    limits: FileLimits,
    *,
    authenticate: Callable[[object], str],
    now: datetime,
    max_text_chars: int,
) -> ChannelMessage:
    """The message of a form with files, its files' bytes in `stash`; `authenticate` gives the
    user of the request and the form's `user` field. Raises `RejectedRequestError` (413 over a
    limit, 501 without a stash, 403 with files turned off, 503 when the stash failed) and
    `ChannelPayloadError`."""
    async with read_upload(request, limits, max_text_chars=max_text_chars) as upload:
        message = parse_web_message(
            dict(upload.fields),
            user_id=authenticate(upload.fields.get("user")),
            now=now,
            max_text_chars=max_text_chars,
            attachments=upload.attachments,
        )
        if not upload.files:
            return message
        if stash is None:
            raise RejectedRequestError(501, "this gateway takes no files on the web channel")
        if not limits.enabled:
            raise RejectedRequestError(403, "reading files is turned off on this gateway")
        try:
            stashed = await upload.stash(stash)
        except StorageError as exc:
            raise RejectedRequestError(503, f"the files could not be stored: {exc}") from exc
    log.info(
        "web.files_stashed",
        message_id=message.message_id,
        files=len(stashed),
        size=sum(attachment.size for attachment in stashed),
    )
    return dataclasses.replace(message, attachments=stashed)


def is_upload(request: Request) -> bool:
    """Whether the request's body is a multipart form (else it is the JSON body)."""
    media_type = request.headers.get("content-type", "").partition(";")[0]
    return media_type.strip().lower() == "multipart/form-data"


@contextlib.asynccontextmanager
async def read_upload(
    request: Request, limits: FileLimits, *, max_text_chars: int
) -> AsyncIterator[Upload]:
    """The request's form within `limits`; the spooled files are closed on leaving. Raises
    `RejectedRequestError` (413) over a limit and `ChannelPayloadError` for a malformed form."""
    text_bytes = 4 * max_text_chars  # UTF-8 takes up to four bytes a character
    most = limits.max_message_bytes + len(TEXT_FIELDS) * text_bytes + FRAMING_BYTES
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > most:
        raise _refused(_total_reason(limits), declared=int(declared))
    bounded = Request(request.scope, _bounded(request.receive, most, limits))
    try:
        form = await bounded.form(
            max_files=limits.max_files,
            max_fields=len(TEXT_FIELDS) + 1,  # and an empty file input
            max_part_size=text_bytes,
        )
    except (HTTPException, MultiPartException) as exc:
        raise _form_refusal(exc, limits, max_text_chars) from exc
    try:
        yield _checked(form.multi_items(), limits)
    finally:
        await form.close()


async def discard(attachments: Sequence[Attachment], stash: FileStash) -> None:
    """Drop the stashed bytes of attachments whose message was not accepted (refused, or a
    duplicate whose first copy has its own)."""
    for attachment in attachments:
        key = attachment.source.get(STASH_KEY)
        if isinstance(key, str):
            await stash.discard(key)


def clean_filename(name: str) -> str:
    """A file name as the client sent it, made safe to show and store: its last path
    component, without control or invisible formatting characters, at most
    `MAX_NAME_CHARS` long (keeping the extension)."""
    last = _PATH_SEPARATORS.split(name)[-1]
    kept = "".join(ch for ch in last if unicodedata.category(ch) not in {"Cc", "Cf"}).strip()
    if kept in {"", ".", ".."}:
        return UNNAMED
    if len(kept) > MAX_NAME_CHARS:
        stem, extension = posixpath.splitext(kept)
        extension = extension if len(extension) <= 16 else ""
        kept = stem[: MAX_NAME_CHARS - len(extension)] + extension
    return kept


def media_type_of(declared: str | None) -> str:
    """The part's declared media type without parameters, or `application/octet-stream`."""
    media_type = (declared or "").partition(";")[0].strip().lower()
    return media_type if _MEDIA_TYPE.fullmatch(media_type) else "application/octet-stream"


def _checked(items: Sequence[tuple[str, str | UploadFile]], limits: FileLimits) -> Upload:
    fields: dict[str, str] = {}
    files: list[tuple[Attachment, UploadFile]] = []
    total = 0
    for name, value in items:
        if isinstance(value, str) and name == FILES_FIELD:
            if value:
                raise ChannelPayloadError(f"'{FILES_FIELD}' parts must be files (with a filename)")
            continue  # a file input left empty
        if isinstance(value, str):
            if name in fields:
                raise ChannelPayloadError(f"'{name}' is given more than once")
            fields[name] = value
            continue
        if name != FILES_FIELD:
            raise ChannelPayloadError(f"files go in parts named '{FILES_FIELD}', not '{name}'")
        size = value.size or 0
        if not value.filename and not size:
            continue  # a file input left empty
        filename = clean_filename(value.filename or "")
        if size > limits.max_file_bytes:
            reason = f"{filename} is {too_large(size, limits.max_file_bytes).reason}"
            raise _refused(reason, name=filename, size=size)
        total += size
        if total > limits.max_message_bytes:
            raise _refused(_total_reason(limits), name=filename, size=size)
        attachment = Attachment(filename, media_type_of(value.content_type), size)
        files.append((attachment, value))
    return Upload(fields, tuple(files))


def _bounded(receive: Receive, most: int, limits: FileLimits) -> Receive:
    """`receive` that refuses the request once more than `most` bytes of body arrived."""
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > most:
                raise _refused(_total_reason(limits), received=seen)
        return message

    return bounded


def _form_refusal(
    exc: HTTPException | MultiPartException, limits: FileLimits, max_text_chars: int
) -> RejectedRequestError | ChannelPayloadError:
    reason = exc.detail if isinstance(exc, HTTPException) else exc.message
    # The parser stops at the limits it was given, and says which in its message.
    if reason.startswith("Too many files"):
        return _refused(f"a message may bring at most {limits.max_files} files")
    if reason.startswith("Part exceeded"):
        return _refused(f"a field is longer than {max_text_chars} characters")
    return ChannelPayloadError(f"the form is not valid multipart/form-data: {reason}")


def _total_reason(limits: FileLimits) -> str:
    return f"the files of one message may be {size_text(limits.max_message_bytes)} together"


def _refused(reason: str, **details: object) -> RejectedRequestError:
    log.info("web.upload_refused", reason=reason, **details)
    return RejectedRequestError(413, reason)
