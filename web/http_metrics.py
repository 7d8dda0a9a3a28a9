"""The metrics routes of the worker's HTTP server: ``GET /metrics`` (Prometheus text format)
and ``GET /v1/metrics/summary`` (JSON,
:class:`~memstream.contract.http_api.metrics.MetricsSummary`).

Both answer to the metrics key (``MEMSTREAM_METRICS_KEY``: opens these two routes and
nothing else, so Prometheus never holds the admin key) or the admin key, presented like any
key (``Authorization: Bearer`` or ``X-API-Key``); anything else is 401, under the same
failed-login limit as every key (429). ``GET /v1/cluster`` (the cluster map, worker URLs)
answers to the admin key only. They answer while the worker is still starting too: that is
when an operator looks. What they serve is set on
the app by :func:`memstream.web.prometheus.attach`; an app without it answers 503.
"""

from __future__ import annotations

import hmac

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import ErrorCode, Principal
from memstream.contract.http_api.metrics import MetricsSummary
from memstream.web.http_base import DEPS, ApiError, PageRoute, Route
from memstream.web.http_checks import check_key, ok, presented_key
from memstream.web.prometheus import METRICS, MetricsDeps

METRICS_READER = Principal(key_id="metrics")  # who the metrics key is (no tenant, no admin)


def _authorised(request: web.Request, metrics_key: bool = True) -> MetricsDeps:
    """The admin key, or (``metrics_key``) the metrics key; else 401 (429 when limited)."""
    deps = request.app.get(METRICS)
    wanted = deps.metrics_key if deps is not None and metrics_key else None

    def accept(key: str) -> Principal | None:
        if wanted and hmac.compare_digest(key.encode(), wanted.encode()):
            return METRICS_READER
        principal = request.app[DEPS].authoriser.authorise(key)
        return principal if principal is not None and principal.admin else None

    try:
        check_key(request, presented_key(request), accept)
    except ApiError as exc:
        if exc.status != 401:
            raise
        raise ApiError(401, ErrorCode.UNAUTHORIZED, "the metrics key or the admin key is "
                       "needed" if metrics_key else "the admin key is needed") from None
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
    return ok(deps.summary())


async def _cluster(request: web.Request) -> web.StreamResponse:
    deps = _authorised(request, metrics_key=False)
    if deps.cluster is None:
        raise ApiError(503, ErrorCode.UNAVAILABLE, "no cluster map here")
    return web.json_response(deps.cluster())


METRICS_ROUTES: tuple[Route, ...] = (
    PageRoute("GET", paths.METRICS, "metrics",
              "Prometheus metrics (text format; the metrics key or the admin key)",
              _metrics, None, media_type="text/plain; version=0.0.4"),
    Route("GET", paths.METRICS_SUMMARY, "metrics_summary",
          "The governance metrics of this worker since it started (metrics or admin key)",
          _summary, MetricsSummary),
    Route("GET", paths.CLUSTER, "cluster",
          "Workers, partitions (owner, standbys), this worker's shards (serving, restoring, "
          "standby) and its loops' lag (the admin key)", _cluster, None),
)
