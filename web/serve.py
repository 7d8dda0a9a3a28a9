"""Start and stop the HTTP API inside the worker (``web_enabled``).

One aiohttp server (:mod:`memstream.web.http`) in the worker's event loop, next to the
stages' loops: the embedded store, the window table and the tool waiters live in this process.
Keys come from the keys topic (:class:`~memstream.web.keys_topic.KeyFollower`) plus the
admin key of the settings; hits go out through the
:class:`~memstream.streams.access.AccessRecorder`. With ``web_tls_cert`` / ``web_tls_key``
it serves HTTPS; requests are forwarded to other workers only with ``cluster_secret``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from memstream.streams import lifecycle
from memstream.streams.access import AccessRecorder
from memstream.streams.pipeline import Pipeline
from memstream.web import probes
from memstream.web import prometheus as metrics
from memstream.web.audit import AuditLog
from memstream.web.backend import WorkerBackend
from memstream.web.forwarding import server_ssl
from memstream.web.http import HttpServer, build_http_app
from memstream.web.http_base import DEPS
from memstream.web.keys import KeyRing
from memstream.web.keys_topic import KeyFollower
from memstream.web.mcp_http import McpEndpoint
from memstream.web.routing import Router, cluster_status

log = logging.getLogger(__name__)
KEYS_READY_S = 30.0


def register(p: Pipeline) -> None:
    s = p.settings
    recorder = AccessRecorder(s, p.topics.memory_access.name,
                              s.access_flush_s, s.access_batch)
    backend = WorkerBackend(p, recorder)
    ring = KeyRing.for_settings(s)
    follower = KeyFollower.for_settings(s, ring)
    router = None
    if p.cluster is not None:  # requests for users other workers own go there
        secret = s.cluster_secret.get_secret_value() if s.cluster_secret else None
        router = Router(p.cluster, s.partitions, p.services.store, secret=secret,
                        ca=s.web_tls_ca)
    http_app = build_http_app(backend, ring, max_body_bytes=s.http_max_body_bytes,
                              router=router,
                              login_failures_per_minute=s.login_failures_per_minute)
    mcp = McpEndpoint(s.http_max_body_bytes, s.mcp_allowed_origins) if s.mcp_enabled else None
    if mcp is not None:  # /mcp: the agent tools over MCP, keyed as the API (web.mcp_http)
        mcp.attach(http_app)
    http_app[DEPS].guard.limit_requests(s.requests_per_key_per_s, s.requests_per_key_burst)
    deps = metrics.attach(http_app, p, follower.rejected)  # /metrics, /v1/metrics/summary
    http_app[metrics.METRICS] = replace(deps, cluster=lambda: cluster_status(p, router))
    tls = server_ssl(s.web_tls_cert, s.web_tls_key) if s.web_tls_cert and s.web_tls_key else None
    server = HttpServer(http_app, s.web_host, s.web_port, tls, shared_port=s.web_shared_port)
    p.api = backend
    audit = AuditLog(s, p.topics.memory_changes.name)
    backend.audit_log = audit

    async def serve() -> None:
        await follower.start()
        if not await follower.wait_ready(KEYS_READY_S):
            log.warning("tenant keys not loaded within %.0fs; only the admin key works yet",
                        KEYS_READY_S)
        recorder.start()
        await audit.start()
        if mcp is not None:
            await mcp.start()
        await asyncio.to_thread(probes.hand_over)  # the startup probes free the port
        await server.start()
        backend.started = True
        log.info("HTTP API on %s://%s:%d/v1 (OpenAPI: /v1/openapi.json)%s",
                 "https" if tls else "http", s.web_host, server.port,
                 f"; also on the shared front port {s.web_shared_port}"
                 if s.web_shared_port is not None else "")

    async def stop() -> None:
        backend.started = False
        await server.stop()
        if mcp is not None:
            await mcp.stop()
        await recorder.close()
        await backend.close()
        if router is not None:
            await router.close()
        await follower.stop()
        await audit.stop()

    # added after every other part: stops serving before the loops stop
    lifecycle.run(p.app, "http-api", serve, stop, background=True)
