"""The metrics routes of the worker's HTTP server: ``GET /metrics`` (Prometheus text format)
and ``GET /v1/metrics/summary`` (JSON, :class:`~memstream.web.models.metrics.MetricsSummary`).

Both answer to the metrics key (``MEMSTREAM_METRICS_KEY``: opens these two routes and
nothing else, so Prometheus never holds the admin key) or the admin key, presented like any
key (``Authorization: Bearer`` or ``X-API-Key``); anything else is 401. They answer while
the worker is still starting too: that is when an operator looks. What they serve is set on
the app by :func:`memstream.web.prometheus.attach`; an app without it answers 503.

Imported by :mod:`memstream.web.http` (its route table), after that module's helpers.
"""

from __future__ import annotations

import hmac

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from memstream.web.http import _DEPS, MAX_KEY_CHARS, ApiError, Route, _ok, _presented_key
from memstream.web.http_inspector import PageRoute
from memstream.web.models.api import ErrorCode
from memstream.web.models.metrics import MetricsSummary
from memstream.web.prometheus import METRICS, MetricsDeps


def _authorised(request: web.Request) -> MetricsDeps:
    deps = request.app.get(METRICS)
    key = _presented_key(request)
    ok = False
    if key and len(key) <= MAX_KEY_CHARS:
        wanted = deps.metrics_key if deps is not None else None
        ok = bool(wanted) and hmac.compare_digest(key.encode(), (wanted or "").encode())
        if not ok:
            principal = request.app[_DEPS].authoriser.authorise(key)
            ok = principal is not None and principal.admin
    if not ok:
        raise ApiError(401, ErrorCode.UNAUTHORIZED, "the metrics key or the admin key is needed")
    if deps is None:
        raise ApiError(503, ErrorCode.UNAVAILABLE, "metrics are not served here")
    return deps


async def _metrics(request: web.Request) -> web.StreamResponse:
    deps = _authorised(request)
    await deps.refresh()
    return web.Response(body=generate_latest(deps.registry),
                        headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})


async def _summary(request: web.Request) -> web.StreamResponse:
    deps = _authorised(request)
    await deps.refresh()
    return _ok(deps.summary())


METRICS_ROUTES: tuple[Route, ...] = (
    PageRoute("GET", "/metrics", "metrics",
              "Prometheus metrics (text format; the metrics key or the admin key)",
              _metrics, None, media_type="text/plain; version=0.0.4"),
    Route("GET", "/v1/metrics/summary", "metrics_summary",
          "The governance metrics of this worker since it started (metrics or admin key)",
          _summary, MetricsSummary),
)
