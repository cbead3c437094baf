"""The admin HTTP API under `/admin/v1/`, for operators' tools; off unless `admin.token` is set.

    GET    /admin/v1/sessions?user=U&status=S&since=7d   sessions (the `sessions list` shape)
    GET    /admin/v1/sessions/{id}                        one session with messages
    GET    /admin/v1/sessions/{id}/export                 a zip of it
    DELETE /admin/v1/sessions/{id}                        delete it for good
    POST   /admin/v1/sessions/{id}/archive                archive it
    GET    /admin/v1/users                                users with identities
    GET    /admin/v1/users/{id}                           one user with memory facts
    GET    /admin/v1/users/{id}/export                    a zip of all their sessions
    DELETE /admin/v1/users/{id}                           delete everything of theirs

Every request needs `Authorization: Bearer <admin.token>` (compared in constant time): 401
without or with a wrong one. Unknown ids get 404, bad parameters 400, each with a reason.
"""

from __future__ import annotations

import asyncio
import hmac
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from channels.base import RefusalResponse
from errors import SessionStateError
from gateway.admin import Administration, NotFoundError
from gateway.log import get_logger
from gateway.settings import parse_duration

log = get_logger(__name__)

Handler = Callable[[Request], Awaitable[Response]]


class AdminAPI:
    """The routes, bound to one `Administration` and one token."""

    def __init__(self, admin: Administration, token: str) -> None:
        if not token:
            raise ValueError("the admin API needs a token")
        self.admin = admin
        self._token = token.encode()

    def routes(self) -> list[Route]:
        """The API's routes (all under `/admin/v1/`)."""
        prefix = "/admin/v1"
        return [
            Route(f"{prefix}/sessions", self._guard(self._sessions), methods=["GET"]),
            Route(f"{prefix}/sessions/{{id}}", self._guard(self._session), methods=["GET"]),
            Route(
                f"{prefix}/sessions/{{id}}", self._guard(self._delete_session), methods=["DELETE"]
            ),
            Route(
                f"{prefix}/sessions/{{id}}/export",
                self._guard(self._export_session),
                methods=["GET"],
            ),
            Route(
                f"{prefix}/sessions/{{id}}/archive", self._guard(self._archive), methods=["POST"]
            ),
            Route(f"{prefix}/users", self._guard(self._users), methods=["GET"]),
            Route(f"{prefix}/users/{{id}}", self._guard(self._user), methods=["GET"]),
            Route(f"{prefix}/users/{{id}}", self._guard(self._delete_user), methods=["DELETE"]),
            Route(f"{prefix}/users/{{id}}/export", self._guard(self._export_user), methods=["GET"]),
        ]

    def _guard(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            supplied = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(supplied.encode(), self._token):
                log.warning("admin_api.unauthorised", path=request.url.path)
                return _error(401, "a valid admin bearer token is required")
            try:
                return await handler(request)
            except NotFoundError as exc:
                return _error(404, str(exc))
            except (ValueError, SessionStateError) as exc:
                return _error(400, str(exc))

        return guarded

    async def _sessions(self, request: Request) -> Response:
        query = request.query_params
        since = parse_duration(query["since"]) if query.get("since") else None
        limit = int(query.get("limit", "1000"))
        rows = await self.admin.list_sessions(
            user_id=query.get("user"), status=query.get("status"), since=since, limit=limit
        )
        return JSONResponse(rows)

    async def _session(self, request: Request) -> Response:
        return JSONResponse(await self.admin.show_session(request.path_params["id"]))

    async def _delete_session(self, request: Request) -> Response:
        deletion = await self.admin.delete_session(request.path_params["id"])
        log.info("admin_api.session_deleted", session_id=request.path_params["id"])
        return JSONResponse(deletion.as_dict())

    async def _archive(self, request: Request) -> Response:
        return JSONResponse(await self.admin.archive_session(request.path_params["id"]))

    async def _users(self, _request: Request) -> Response:
        return JSONResponse(await self.admin.list_users())

    async def _user(self, request: Request) -> Response:
        return JSONResponse(await self.admin.show_user(request.path_params["id"]))

    async def _delete_user(self, request: Request) -> Response:
        deletion = await self.admin.delete_user(request.path_params["id"])
        log.info("admin_api.user_deleted", user_id=request.path_params["id"])
        return JSONResponse(deletion.as_dict())

    async def _export_session(self, request: Request) -> Response:
        session_id = request.path_params["id"]
        return await self._zip(f"session-{session_id}.zip", session_id=session_id)

    async def _export_user(self, request: Request) -> Response:
        user_id = request.path_params["id"]
        return await self._zip(f"user-{user_id}.zip", user_id=user_id)

    async def _zip(self, name: str, **target: Any) -> Response:
        # Every file operation in a worker thread: the folder, the zip (`export_zip` builds it
        # in one), reading it back, and removing it all.
        folder = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="gateway-export-"))
        try:
            path = folder / name
            await self.admin.export_zip(path, **target)
            data = await asyncio.to_thread(path.read_bytes)
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, ignore_errors=True)
        return Response(
            data,
            media_type="application/zip",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )


def _error(status: int, reason: str) -> JSONResponse:
    return RefusalResponse(status, reason)
