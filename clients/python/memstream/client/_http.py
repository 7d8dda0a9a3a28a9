"""The client's HTTP seam: a request, its answer, and the transport that carries one to the
other (urllib3 by default: thread-safe connection pools, TLS from an ``ssl.SSLContext``,
no dependency of its own).

A transport is any callable ``Request -> Response``; it raises :class:`ConnectError` when no
connection could be made (the request cannot have reached the server: another worker may
be asked) and :class:`TransportError` for any other failure without an answer (the server
may have taken it). Tests pass their own callable as ``transport=``.
"""

from __future__ import annotations

import json as jsonlib
import ssl
import threading
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import urllib3
from urllib3.exceptions import ConnectTimeoutError, HTTPError, SSLError


class TransportError(Exception):
    """The request got no answer; the server may have received it (a read timeout)."""


class ConnectError(TransportError):
    """No connection was made (refused, unresolved, TLS handshake): the request cannot have
    reached the server."""


@dataclass(frozen=True)
class Request:
    """One HTTP request: ``url`` is absolute and holds the query string."""

    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    content: bytes | None = None
    timeout: float = 10.0

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def path(self) -> str:
        """The path as sent (percent-escapes kept), without the query."""
        return urlsplit(self.url).path

    @property
    def params(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.url).query, keep_blank_values=True))

    def header(self, name: str) -> str | None:
        """A header's value, the name in any case (None: not sent)."""
        wanted = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == wanted), None)

    def json(self) -> Any:
        return None if not self.content else jsonlib.loads(self.content)


class Response:
    """One HTTP answer: its status and body (read whole)."""

    def __init__(self, status_code: int, *, content: bytes = b"", json: Any = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.status_code = status_code
        self.content = content if json is None else encode_json(json)
        self.headers = dict(headers or {})

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    def __repr__(self) -> str:
        return f"Response({self.status_code})"


Transport = Callable[[Request], Response]
CONCURRENCY = 32  # requests of one client under way at once (connections kept per worker)


def encode_json(value: Any) -> bytes:
    return jsonlib.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class Urllib3Transport:
    """The default transport: urllib3 pool managers (thread-safe, keep connections alive), no
    retries and no redirects of their own (the client's failover decides). A proxy is taken
    from ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``NO_PROXY`` as httpx (and urllib) read them,
    unless ``proxies`` (scheme -> proxy URL, ``{}``: none) says otherwise."""

    def __init__(self, verify: bool | ssl.SSLContext = True, maxsize: int = CONCURRENCY,
                 proxies: Mapping[str, str] | None = None) -> None:
        self._tls: dict[str, Any]
        if isinstance(verify, ssl.SSLContext):
            self._tls = {"ssl_context": verify}
        elif verify:  # the system's CAs
            self._tls = {"cert_reqs": "CERT_REQUIRED"}
        else:
            self._tls = {"cert_reqs": "CERT_NONE"}
        self._maxsize = maxsize
        self._pool = urllib3.PoolManager(maxsize=maxsize, **self._tls)
        self._proxies = dict(urllib.request.getproxies() if proxies is None else proxies)
        self._via: dict[str, urllib3.ProxyManager] = {}
        self._lock = threading.Lock()

    def _manager(self, url: str) -> urllib3.PoolManager:
        parts = urlsplit(url)
        proxy = self._proxies.get(parts.scheme)
        if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
            return self._pool
        with self._lock:
            if proxy not in self._via:
                self._via[proxy] = urllib3.ProxyManager(proxy, maxsize=self._maxsize,
                                                        **self._tls)
            return self._via[proxy]

    def __call__(self, request: Request) -> Response:
        try:
            answer = self._manager(request.url).request(
                request.method, request.url, body=request.content,
                headers=dict(request.headers), retries=False, redirect=False,
                timeout=urllib3.Timeout(connect=request.timeout, read=request.timeout))
        except (ConnectTimeoutError, SSLError) as exc:  # NewConnectionError is one too
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        except HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        return Response(answer.status, content=answer.data, headers=dict(answer.headers))

    def close(self) -> None:
        self._pool.clear()
        for manager in self._via.values():
            manager.clear()
