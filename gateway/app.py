"""The ASGI application: health, readiness and metrics endpoints, and the channels' routes."""

from __future__ import annotations

import time

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from errors import StorageError
from gateway.admin_api import AdminAPI
from gateway.log import get_logger
from gateway.metrics import CONTENT_TYPE
from gateway.runtime import GatewayRuntime

log = get_logger(__name__)


def _runtime(request: Request) -> GatewayRuntime:
    runtime: GatewayRuntime = request.app.state.runtime
    return runtime


async def healthz(_request: Request) -> Response:
    """Liveness: the process serves requests."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Readiness: the database answers; 503 with the reason when it does not."""
    try:
        await _runtime(request).database.ping()
    except StorageError as exc:
        log.warning("readiness.failed", reason=str(exc))
        return JSONResponse({"status": "unavailable", "reason": str(exc)}, status_code=503)
    return JSONResponse({"status": "ready"})


async def metrics(request: Request) -> Response:
    """Prometheus text exposition of this app's registry (gauges read from the database)."""
    runtime = _runtime(request)
    try:
        await runtime.refresh_gauges()
    except StorageError as exc:
        # The counters are still worth serving; the gauges keep their last values.
        log.warning("metrics.gauges_failed", error=str(exc).splitlines()[0])
    return Response(runtime.metrics.render(), media_type=CONTENT_TYPE)


class RequestMetricsMiddleware:
    """Counts and times every HTTP request by its route template (not its raw path)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Record the status code and latency of one request."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = scope.get("route")
            name = getattr(route, "path", "unmatched")
            gateway_metrics = scope["app"].state.runtime.metrics
            gateway_metrics.http_requests.labels(name, str(status)).inc()
            gateway_metrics.http_latency.labels(name).observe(time.perf_counter() - started)


def create_app(runtime: GatewayRuntime) -> Starlette:
    """The gateway's ASGI app, bound to an already started runtime."""
    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    for adapter in runtime.adapters.values():
        routes.extend(adapter.routes())
    admin_token = runtime.config.admin.token.get_secret_value()
    if admin_token:
        routes.extend(AdminAPI(runtime.admin, admin_token).routes())
    app = Starlette(
        routes=routes,
        middleware=[Middleware(RequestMetricsMiddleware)],
    )
    app.state.runtime = runtime
    return app
