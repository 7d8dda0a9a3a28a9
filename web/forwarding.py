"""What one worker trusts of a request another worker forwarded, and nothing a client sends.

- **Ingress** (:func:`ingress`, the app's first middleware after the error one): a request
  target that is not a path (absolute form, ``GET http://x/v1/...``) is 400; every
  ``X-Memstream-*`` header a request arrives with is dropped, unless it carries a
  ``X-Memstream-Credential`` that verifies (:func:`memstream.core.cluster_auth.check_forward`:
  the cluster secret, this exact method, path, body and signed headers, fresh, its nonce
  not seen before); then the worker that sent it (``X-Memstream-Forwarded``), its caller's
  principal (``X-Memstream-Principal``: checked by the worker the caller reached) and a
  standby read (``X-Memstream-Standby-Read``) are taken from it, as request keys, never
  from the headers later on. A credential that does not verify (or any, on a worker without
  the secret) is 401. A write (:attr:`Route.write`) gets its ``Idempotency-Key`` here: the
  caller's (checked), else a new one; the answer carries it.
- **Outbound** (:func:`outbound`): the headers of a forward: no key of the caller's, only
  the signed ones and the credential over them; it goes to :func:`forward_url`: the
  verified base URL's scheme, host and port with the path and query re-encoded from the
  parsed request (:func:`forward_target`, which the credential signs).
- **TLS** (:func:`client_ssl`, :func:`server_ssl`): the contexts of the forwarder's session
  (peers verified with ``web_tls_ca`` or the system's CAs) and of the server.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware
from multidict import CIMultiDict
from pydantic import ValidationError
from yarl import URL

from memstream.contract.http_api.api import ErrorCode, Principal
from memstream.core.cluster_auth import (
    CREDENTIAL_HEADER,
    IDEMPOTENCY_KEY,
    SIGNED_PREFIX,
    SeenNonces,
    check_forward,
    forward_credential,
)
from memstream.streams.cluster_trust import allowed_url
from memstream.web.http_base import DEPS, ApiError, Handler
from memstream.web.http_checks import (
    FORWARDED_BY,
    IDEMPOTENCY,
    PRINCIPAL,
    idempotency_key,
    read_body,
)

FORWARDED = "X-Memstream-Forwarded"
PRINCIPAL_HEADER = "X-Memstream-Principal"
STANDBY_READ = "X-Memstream-Standby-Read"  # a forwarded read a standby shard may answer
TO = "X-Memstream-To"  # the worker a forward is for: another worker refuses it (signed)
STANDBY_ASKED = web.RequestKey("memstream_standby_read", bool)  # ingress sets it from that


@dataclass
class ForwardGate:
    """Checks the credential of forwarded requests (one per worker: the nonce cache)."""

    secret: str
    me: str  # this worker's id: a forward for another worker is refused
    clock: Callable[[], float] = time.time
    seen: SeenNonces | None = None

    def __post_init__(self) -> None:
        self.seen = self.seen or SeenNonces()

    def check(self, method: str, target: str, body: bytes,
              headers: CIMultiDict[str] | web.Request) -> bool:
        hdrs = headers.headers if isinstance(headers, web.Request) else headers
        if hdrs.get(TO) != self.me:  # a capture replayed at another worker
            return False
        return check_forward(self.secret, hdrs.get(CREDENTIAL_HEADER, ""),
                             worker=hdrs.get(FORWARDED, ""), method=method, target=target,
                             body=body, headers=hdrs, now=self.clock(), seen=self.seen)


def internal(name: str) -> bool:
    return name.lower().startswith(SIGNED_PREFIX)


def stripped(request: web.Request) -> web.Request:
    """``request`` without any ``X-Memstream-*`` header (a clone when it had one)."""
    if not any(internal(name) for name in request.headers):
        return request
    kept = CIMultiDict((k, v) for k, v in request.headers.items() if not internal(k))
    return request.clone(headers=kept)


def _refused() -> ApiError:
    return ApiError(401, ErrorCode.UNAUTHORIZED, "invalid worker credential")


async def _verified(request: web.Request, gate: ForwardGate | None) -> web.Request:
    """A forwarded request whose credential verifies, its facts as request keys and its
    internal headers dropped; 401 for any other request with a credential."""
    if gate is None:
        raise _refused()
    body = await read_body(request, request.app[DEPS].max_body_bytes)
    if not gate.check(request.method, request.raw_path, body, request):
        raise _refused()
    try:
        principal = Principal.model_validate_json(request.headers.get(PRINCIPAL_HEADER, ""))
    except ValidationError:
        raise _refused() from None
    worker, given = request.headers[FORWARDED], request.headers.get(IDEMPOTENCY_KEY)
    standby = request.headers.get(STANDBY_READ) == "1"
    request = stripped(request)
    request[FORWARDED_BY], request[PRINCIPAL], request[STANDBY_ASKED] = worker, principal, standby
    if given is not None:
        request[IDEMPOTENCY] = given
    return request


def ingress(gate: ForwardGate | None, writes: Collection[str]) -> Middleware:
    """The middleware of the module doc; ``writes``: the names of the write routes. The
    write's key is set on the request as it arrived too: the error middleware, outside
    this one, puts it on every answer to it."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.raw_path.startswith("/"):  # absolute form (GET http://x/...): its
            # path would reach the routes while a forward's URL was made of the raw target
            raise ApiError(400, ErrorCode.BAD_REQUEST, "the request target must be a path "
                           "(origin form: /v1/...)")
        arrived = request
        if CREDENTIAL_HEADER in arrived.headers:
            request = await _verified(arrived, gate)
        else:
            request = stripped(arrived)
        if request.match_info.route.name not in writes:
            return await handler(request)
        if IDEMPOTENCY not in request:
            request[IDEMPOTENCY] = idempotency_key(request.headers.get(IDEMPOTENCY_KEY))
        arrived[IDEMPOTENCY] = request[IDEMPOTENCY]  # the error middleware answers with it
        return await handler(request)

    return check


class BadOwnerURL(ValueError):
    """The URL a verified map gives a worker is not one to forward to (a configuration
    error, never "the owner is down")."""


def forward_target(request: web.Request) -> URL:
    """The path and query a forward sends and signs, re-encoded from the parsed request
    (never the raw target as it arrived)."""
    return URL.build(path=request.rel_url.path, query=request.rel_url.query)


def forward_url(base: str, target: URL) -> URL:
    """Where a forward of ``target`` (:func:`forward_target`) to the worker advertised at
    ``base`` goes: ``base``'s scheme, host and port, its path (a prefix) and the target's
    path and query; :class:`BadOwnerURL` when ``base`` is not a plain ``http(s)`` URL."""
    if not allowed_url(base):
        raise BadOwnerURL("not an http(s) URL with a host")
    try:
        parsed = URL(base)
        origin = parsed.origin()
    except ValueError as exc:
        raise BadOwnerURL(type(exc).__name__) from None
    if parsed.user or parsed.password or parsed.query_string or parsed.fragment:
        raise BadOwnerURL("it has credentials, a query or a fragment")
    return origin.with_path(parsed.path.rstrip("/") + target.path).with_query(target.query)


def outbound(secret: str, me: str, request: web.Request, body: bytes, principal: Principal,
             standby: bool, now: float, to: str, target: str | None = None,
             ) -> dict[str, str]:
    """The headers of a forward of ``request`` to worker ``to``: no key of the caller's,
    only what the credential signs (and the body's type); ``target``: the path and query
    it is sent to (default: :func:`forward_target`'s)."""
    if target is None:
        target = forward_target(request).raw_path_qs
    headers = {"Accept": "application/json", FORWARDED: me, TO: to,
               PRINCIPAL_HEADER: principal.model_dump_json()}
    if body:
        headers["Content-Type"] = request.headers.get("Content-Type", "application/json")
    if standby:
        headers[STANDBY_READ] = "1"
    if request.get(IDEMPOTENCY):
        headers[IDEMPOTENCY_KEY] = request[IDEMPOTENCY]
    headers[CREDENTIAL_HEADER] = forward_credential(
        secret, worker=me, method=request.method, target=target, body=body,
        headers=headers, now=now)
    return headers


def client_ssl(ca: Path | None) -> ssl.SSLContext:
    """Peers verified with ``ca`` (a PEM bundle), else the system's CAs."""
    return ssl.create_default_context(cafile=str(ca) if ca is not None else None)


def server_ssl(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context
