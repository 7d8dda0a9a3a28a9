"""The probes' answers while the worker starts, before its HTTP API serves.

``memstream worker`` first waits for the broker and checks the topics
(:func:`memstream.topics.layout.prepare`, up to ``broker_wait_s``), then builds the
pipeline, loads the embedder and starts the Faust app, whose last part starts the HTTP API
once the tenant keys are loaded. A Kubernetes liveness probe must not kill it meanwhile, and
a readiness probe must see it is not ready: :class:`StartupProbes` serves ``GET /v1/live``
(200, ``alive``) and ``GET /v1/health`` (503, ``starting``) on the API's address from a
thread of its own, from before the broker wait until the API takes the port over
(:func:`memstream.web.serve.register`). Nothing else is served: every other path is 404.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading

from aiohttp import web

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import Health, Live
from memstream.core.errors import describe
from memstream.core.settings import Settings
from memstream.web.forwarding import server_ssl
from memstream.web.http import HttpServer
from memstream.web.http_checks import ok

log = logging.getLogger(__name__)


def probe_app(waiting: list[str]) -> web.Application:
    """Live, and not ready: ``waiting`` says for what (read at every request)."""
    async def live(_: web.Request) -> web.StreamResponse:
        return ok(Live())

    async def health(_: web.Request) -> web.StreamResponse:
        return ok(Health(status="starting", waiting=list(waiting)), 503)

    app = web.Application()
    app.router.add_get(paths.LIVE, live)
    app.router.add_get(paths.HEALTH, health)
    return app


class StartupProbes:
    """The probe app on ``host:port`` in a thread with its own event loop, until
    :meth:`stop`. A port that cannot be bound is logged, not fatal: the worker starts as
    before, without probes until its API serves."""

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None,
                 waiting: tuple[str, ...] = ("broker",)) -> None:
        self.waiting = list(waiting)
        self._server = HttpServer(probe_app(self.waiting), host, port, ssl_context)
        self._loop = asyncio.new_event_loop()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._run, name="startup-probes", daemon=True)
        self.serving = False

    @classmethod
    def for_settings(cls, s: Settings) -> StartupProbes:
        tls = server_ssl(s.web_tls_cert, s.web_tls_key) if s.web_tls_cert and s.web_tls_key \
            else None
        return cls(s.web_host, s.web_port, tls)

    @property
    def port(self) -> int:
        return self._server.port

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._server.start())
            self.serving = True
        except OSError as exc:
            log.warning("startup probes not served on %s: %s", self._server.port,
                        describe(exc))
        finally:
            self._bound.set()
        if self.serving:
            self._loop.run_forever()
            self._loop.run_until_complete(self._server.stop())
        self._loop.close()

    def start(self) -> StartupProbes:
        self._thread.start()
        self._bound.wait()
        return self

    def stop(self) -> None:
        """Stop serving (the port is free when this returns); idempotent."""
        if self._thread.is_alive():
            if self.serving:
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()


_started: StartupProbes | None = None


def start_early(s: Settings) -> StartupProbes | None:
    """Serve the probes until :func:`hand_over` (``web_enabled`` only)."""
    global _started
    if not s.web_enabled or _started is not None:
        return _started
    _started = StartupProbes.for_settings(s).start()
    return _started


def waiting_for(what: str) -> None:
    """What the early probes' ``/v1/health`` says the worker waits for."""
    if _started is not None:
        _started.waiting[:] = [what]


def hand_over() -> None:
    """Stop the early probes: the HTTP API binds the port next."""
    global _started
    probes, _started = _started, None
    if probes is not None:
        probes.stop()
