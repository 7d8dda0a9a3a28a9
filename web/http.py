"""The worker's HTTP API (``/v1``, plain aiohttp): keys, tenant scoping, bounded bodies and
one JSON error shape, all driven by one route table (:data:`ROUTES`), which
:mod:`memstream.web.openapi` documents too, so the app and its document cannot drift apart.

It runs in the worker's own event loop next to the stages' loops (the embedded store and the
tables live in that process); Faust's web views are not used, so this layer has no Faust
dependency and is tested with aiohttp's test server alone. What a call *does* is the
:class:`Backend`'s business; this package only turns HTTP into typed calls and back.

The package imports one way: :mod:`.http_base` (ApiError, Backend, Route) and
:mod:`.http_checks` (key, scope, bodies) under the route modules (:mod:`.http_core`,
:mod:`.http_governance`, :mod:`.http_ingest`, :mod:`.http_inspector`,
:mod:`.http_metrics`), under this module, which assembles the table, builds the app (its
error middleware and OpenAPI document) and serves it. Every path is a constant of
:mod:`memstream.contract.http_api.paths`.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from memstream.contract.http_api.api import ErrorBody, ErrorCode, ErrorDetail
from memstream.core.errors import describe, trace
from memstream.core.retry import is_transient
from memstream.memory.store.partitioned import ShardNotHere
from memstream.web.forwarding import ingress
from memstream.web.http_base import (
    DEPS,
    HTTP_CODES,
    IDEMPOTENCY_KEY,
    ApiError,
    Authoriser,
    Backend,
    Deps,
    LoginGuard,
    Route,
)
from memstream.web.http_checks import IDEMPOTENCY, bound
from memstream.web.http_core import CORE_ROUTES
from memstream.web.http_governance import GOVERNANCE_ROUTES
from memstream.web.http_ingest import INGEST_ROUTES
from memstream.web.http_inspector import INSPECTOR_ROUTES
from memstream.web.http_metrics import METRICS_ROUTES
from memstream.web.openapi import openapi_document
from memstream.web.routing import Router

__all__ = ["ROUTES", "ApiError", "Authoriser", "Backend", "HttpServer", "Route",
           "build_http_app"]

log = logging.getLogger(__name__)

# Core; history, corrections, forget-me and audit; the HTTP way in (messages, session
# ends); the inspector page; metrics.
ROUTES: tuple[Route, ...] = (CORE_ROUTES + GOVERNANCE_ROUTES + INGEST_ROUTES + INSPECTOR_ROUTES
                             + METRICS_ROUTES)
WRITES = frozenset(r.name for r in ROUTES if r.write)  # each takes an Idempotency-Key


def _error(status: int, code: ErrorCode, message: str,
           headers: Mapping[str, str] | None = None) -> web.Response:
    body = ErrorBody(error=ErrorDetail(code=code, message=bound(message)))
    resp = web.json_response(body.model_dump(mode="json"), status=status, headers=headers)
    if status == 401:
        resp.headers["WWW-Authenticate"] = "Bearer"
    elif status == 503 and "Retry-After" not in resp.headers:
        resp.headers["Retry-After"] = "1"
    elif status == 413:
        resp.force_close()  # do not linger reading a body we refused
    return resp


@web.middleware
async def _errors(request: web.Request,
                  handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                  ) -> web.StreamResponse:
    """Every failure leaves as an :class:`ErrorBody`; aiohttp's own 404/405/413 included.
    Every answer to a write carries its ``Idempotency-Key`` (an error's too: retry with
    it)."""
    response = await _answer(request, handler)
    if IDEMPOTENCY in request and IDEMPOTENCY_KEY not in response.headers:
        response.headers[IDEMPOTENCY_KEY] = request[IDEMPOTENCY]
    return response


async def _answer(request: web.Request,
                  handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                  ) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return _error(exc.status, exc.code, exc.message, exc.headers)
    except ShardNotHere as exc:  # its owner is restoring it, or cannot be reached
        log.info("http: %s", describe(exc))
        return _error(503, ErrorCode.UNAVAILABLE, "this user's memories are moving between "
                      "workers; retry shortly")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = HTTP_CODES.get(exc.status, ErrorCode.INTERNAL
                               if exc.status >= 500 else ErrorCode.BAD_REQUEST)
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        message = {404: "no such route",
                   405: f"{request.method} is not allowed here"}.get(exc.status, exc.reason)
        return _error(exc.status, code, message, allow)
    except Exception as exc:
        route = request.match_info.route.name or "?"
        if is_transient(exc):  # a store / broker hiccup: the caller may retry
            log.warning("http %s: transient %s", route, type(exc).__name__)
            return _error(503, ErrorCode.UNAVAILABLE, "temporarily unavailable, retry later")
        log.error("http %s: unhandled error\n%s", route, trace(exc))
        return _error(500, ErrorCode.INTERNAL, "internal error")


def build_http_app(backend: Backend, authoriser: Authoriser, *,
                   max_body_bytes: int = 65536, router: Router | None = None,
                   login_failures_per_minute: int = 20,
                   clock: Callable[[], float] = time.monotonic) -> web.Application:
    """``router``: requests for users another worker owns go there (web.routing), and
    requests other workers forward are verified with its cluster secret (web.forwarding;
    without a router none is accepted). ``clock``: of the failed-login limit."""
    gate = router.gate if router is not None else None
    middlewares: list[Any] = [_errors, ingress(gate, WRITES)]
    if router is not None:
        middlewares.append(router.middleware)
    app = web.Application(middlewares=middlewares, client_max_size=max_body_bytes)
    app[DEPS] = Deps(backend, authoriser, max_body_bytes, openapi_document(ROUTES),
                     LoginGuard(login_failures_per_minute, clock))
    for r in ROUTES:  # add_route, not add_get: no implicit HEAD routes outside the table
        app.router.add_route(r.method, r.path, r.handler, name=r.name)
    return app


# --- serving ---------------------------------------------------------------------------
class HttpServer:
    """The app on a TCP port, started and stopped by the worker. With ``port=0`` the OS picks
    a free port (give a literal address: "localhost" may bind two sockets, two ports). With
    ``shared_port`` it also serves that port, bound with SO_REUSEPORT. With
    ``ssl_context`` (:func:`memstream.web.forwarding.server_ssl`) it serves HTTPS."""

    def __init__(self, app: web.Application, host: str, port: int,
                 ssl_context: ssl.SSLContext | None = None,
                 shared_port: int | None = None) -> None:
        self._app, self._host, self._port = app, host, port
        self._ssl = ssl_context
        self._shared = shared_port  # also served, with SO_REUSEPORT (docs/processes.md)
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        """The bound port once started, the requested one before."""
        return self._port

    async def start(self) -> None:
        if self._runner is not None:
            return
        runner = web.AppRunner(self._app)
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port, ssl_context=self._ssl).start()
            port = runner.addresses[0][1]
            if self._shared is not None:  # the front port of `--processes N`: the kernel
                # spreads its connections over every process that serves it
                await web.TCPSite(runner, self._host, self._shared, ssl_context=self._ssl,
                                  reuse_port=True).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = port

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
