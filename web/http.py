"""The worker's HTTP API (``/v1``, plain aiohttp): keys, tenant scoping, bounded bodies and
one JSON error shape, all driven by one route table (:data:`ROUTES`), which
:mod:`memstream.web.openapi` documents too, so the app and its document cannot drift apart.

It runs in the worker's own event loop next to the stages' loops (the embedded store and the
tables live in that process); Faust's web views are not used, so this layer has no Faust
dependency and is tested with aiohttp's test server alone. What a call *does* is the
:class:`Backend`'s business; this module only turns HTTP into typed calls and back.

A scoped route checks, in this order: key (401), path ids (400), tenant (403), readiness
(503), then reads the body (413 / 400). The body is never read for a caller without a key.
The ``Content-Type`` is not checked: a body that parses as a JSON object is accepted (curl's
default form type and a missing header are common mistakes that cost nothing to forgive).
Keys are handed to the :class:`Authoriser` and nowhere else: not logged, not echoed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from memstream.core.errors import MemstreamError
from memstream.core.retry import is_transient
from memstream.memory.model import MemoryType, Status
from memstream.topics.schemas import ID_PATTERN, ToolWrite
from memstream.web.models.api import (
    MAX_PAGE,
    Accepted,
    ContextRequest,
    ContextResponse,
    ErrorBody,
    ErrorCode,
    ErrorDetail,
    FeedbackRequest,
    Health,
    MemoryPage,
    Principal,
    SearchRequest,
    SearchResponse,
    ToolCallRequest,
    ToolList,
    ToolResult,
)
from memstream.web.models.history import (
    AuditPage,
    ChangePage,
    CorrectionRequest,
    CorrectionResult,
    HistoryResponse,
    Residue,
    SourceResponse,
)

log = logging.getLogger(__name__)

DEFAULT_PAGE = 100
MAX_CURSOR_CHARS = 200
MAX_KEY_CHARS = 1024  # longer "keys" are refused without asking the authoriser
MAX_MESSAGE_CHARS = 300  # error messages stay short and never carry the caller's input back
LIST_STATUSES = (*(s.value for s in Status), "all")
LIST_TYPES = tuple(t.value for t in MemoryType)
_LIMIT_RE = re.compile(r"[0-9]{1,6}")


class ApiError(MemstreamError):
    """An answer given on purpose: HTTP status, stable code, short message for the caller.
    A :class:`Backend` raises it too (e.g. 404 for an unknown memory); it passes through."""

    def __init__(self, status: int, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = ErrorCode(code)
        self.message = message


class Authoriser(Protocol):
    def authorise(self, presented: str) -> Principal | None: ...


class Backend(Protocol):
    def ready(self) -> bool: ...
    def tools(self) -> list[dict[str, Any]]: ...
    async def list_memories(self, tenant: str, user: str, *, limit: int, cursor: str | None,
                            status: str | None, type: str | None) -> MemoryPage: ...
    async def search(self, tenant: str, user: str, req: SearchRequest) -> SearchResponse: ...
    async def context(self, tenant: str, user: str, req: ContextRequest) -> ContextResponse: ...
    async def feedback(self, tenant: str, user: str, req: FeedbackRequest) -> Accepted: ...
    async def execute_tool(self, tenant: str, user: str, req: ToolCallRequest,
                           principal: Principal) -> ToolResult: ...
    async def history(self, tenant: str, user: str, memory_id: str) -> HistoryResponse: ...
    async def source(self, tenant: str, user: str, memory_id: str,
                     version: int | None) -> SourceResponse: ...
    async def changes(self, tenant: str, user: str, *, limit: int,
                      cursor: str | None) -> ChangePage: ...
    async def correct(self, tenant: str, user: str, write: ToolWrite, req: CorrectionRequest,
                      principal: Principal) -> CorrectionResult: ...
    async def forget(self, tenant: str, user: str, req: CorrectionRequest,
                     principal: Principal) -> CorrectionResult: ...
    async def residue(self, tenant: str, user: str) -> Residue: ...
    async def audit(self, tenant: str, *, limit: int, cursor: str | None, user: str | None,
                    kind: str | None) -> AuditPage: ...


# --- plumbing --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Deps:
    backend: Backend
    authoriser: Authoriser
    max_body_bytes: int
    openapi: dict[str, Any]


_DEPS = web.AppKey("memstream_http", _Deps)


def _bound(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def _bad(message: str) -> ApiError:
    return ApiError(400, ErrorCode.BAD_REQUEST, message)


def _error(status: int, code: ErrorCode, message: str,
           headers: Mapping[str, str] | None = None) -> web.Response:
    body = ErrorBody(error=ErrorDetail(code=code, message=_bound(message)))
    resp = web.json_response(body.model_dump(mode="json"), status=status, headers=headers)
    if status == 401:
        resp.headers["WWW-Authenticate"] = "Bearer"
    elif status == 503:
        resp.headers["Retry-After"] = "1"
    elif status == 413:
        resp.force_close()  # do not linger reading a body we refused
    return resp


def _ok(model: BaseModel, status: int = 200) -> web.Response:
    return web.json_response(model.model_dump(mode="json"), status=status)


# The stable code of each error status (the OpenAPI document names them the same way).
HTTP_CODES = {400: ErrorCode.BAD_REQUEST, 401: ErrorCode.UNAUTHORIZED,
               403: ErrorCode.FORBIDDEN, 404: ErrorCode.NOT_FOUND,
               405: ErrorCode.METHOD_NOT_ALLOWED, 413: ErrorCode.PAYLOAD_TOO_LARGE,
               503: ErrorCode.UNAVAILABLE}


@web.middleware
async def _errors(request: web.Request,
                  handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                  ) -> web.StreamResponse:
    """Every failure leaves as an :class:`ErrorBody`; aiohttp's own 404/405/413 included."""
    try:
        return await handler(request)
    except ApiError as exc:
        return _error(exc.status, exc.code, exc.message)
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
        log.exception("http %s: unhandled error", route)
        return _error(500, ErrorCode.INTERNAL, "internal error")


# --- request checks --------------------------------------------------------------------
def _presented_key(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("X-API-Key", "").strip()


def _authenticate(request: web.Request) -> Principal:
    key = _presented_key(request)
    ok = bool(key) and len(key) <= MAX_KEY_CHARS
    principal = request.app[_DEPS].authoriser.authorise(key) if ok else None
    if principal is None:
        raise ApiError(401, ErrorCode.UNAUTHORIZED, "missing or unknown API key")
    return principal


def _scoped(request: web.Request, *names: str) -> tuple[Principal, list[str]]:
    """Key, path ids (the first one the tenant), tenant, readiness: everything checked
    before a body is read."""
    principal = _authenticate(request)
    values = [request.match_info[name] for name in names]
    for label, value in zip(names, values, strict=True):
        if not ID_PATTERN.fullmatch(value):
            raise _bad(f"invalid {label} id: 1-128 of letters, digits and . _ : @ + = -")
    if not principal.may_open(values[0]):
        raise ApiError(403, ErrorCode.FORBIDDEN, "this key does not open this tenant")
    if not request.app[_DEPS].backend.ready():
        raise ApiError(503, ErrorCode.UNAVAILABLE, "starting, retry later")
    return principal, values


def _scope(request: web.Request) -> tuple[str, str, Principal]:
    principal, (tenant, user) = _scoped(request, "tenant", "user")
    return tenant, user, principal


async def _read_object(request: web.Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, read at most ``limit`` bytes far (chunked bodies too)."""
    too_large = ApiError(413, ErrorCode.PAYLOAD_TOO_LARGE, f"body larger than {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    data = bytearray()
    while chunk := await request.content.readany():
        data += chunk
        if len(data) > limit:
            raise too_large
    try:
        obj = json.loads(bytes(data), parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise _bad(f"body is not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError):  # bad UTF-8, NaN / Infinity, absurd nesting
        raise _bad("body is not valid JSON") from None
    if not isinstance(obj, dict):
        raise _bad("body must be a JSON object")
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _validation_message(exc: ValidationError) -> str:
    """Names the fields and what is wrong with them, never the values sent."""
    parts = [f"{'.'.join(str(p)[:40] for p in e['loc']) or 'body'}: {e['msg']}"
             for e in exc.errors(include_url=False, include_input=False, include_context=False)]
    return _bound("invalid body: " + "; ".join(parts))


def _list_params(query: Mapping[str, str]) -> dict[str, Any]:
    raw = query.get("limit", str(DEFAULT_PAGE))
    if not _LIMIT_RE.fullmatch(raw) or not 1 <= int(raw) <= MAX_PAGE:
        raise _bad(f"limit must be an integer from 1 to {MAX_PAGE}")
    cursor = query.get("cursor") or None
    if cursor is not None and len(cursor) > MAX_CURSOR_CHARS:
        raise _bad(f"cursor longer than {MAX_CURSOR_CHARS} characters")
    status, type_ = query.get("status") or None, query.get("type") or None
    if status is not None and status not in LIST_STATUSES:
        raise _bad(f"status must be one of {', '.join(LIST_STATUSES)}")
    if type_ is not None and type_ not in LIST_TYPES:
        raise _bad(f"type must be one of {', '.join(LIST_TYPES)}")
    return {"limit": int(raw), "cursor": cursor, "status": status, "type": type_}


# --- handlers --------------------------------------------------------------------------
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
B = TypeVar("B", bound=BaseModel)


async def _health(request: web.Request) -> web.StreamResponse:
    ready = request.app[_DEPS].backend.ready()
    return _ok(Health(status="ok" if ready else "starting"), 200 if ready else 503)


async def _openapi(request: web.Request) -> web.StreamResponse:
    return web.json_response(request.app[_DEPS].openapi)


async def _tools(request: web.Request) -> web.StreamResponse:
    _authenticate(request)
    return _ok(ToolList(tools=request.app[_DEPS].backend.tools()))


async def _list(request: web.Request) -> web.StreamResponse:
    tenant, user, _ = _scope(request)
    params = _list_params(request.query)
    return _ok(await request.app[_DEPS].backend.list_memories(tenant, user, **params))


def _post(model: type[B],
          call: Callable[[Backend, str, str, B, Principal], Awaitable[BaseModel]]) -> Handler:
    """One handler shape for every POST: scope, body into ``model``, backend call."""

    async def handle(request: web.Request) -> web.StreamResponse:
        tenant, user, principal = _scope(request)
        deps = request.app[_DEPS]
        obj = await _read_object(request, deps.max_body_bytes)
        try:
            body = model.model_validate(obj)
        except ValidationError as exc:
            raise _bad(_validation_message(exc)) from None
        return _ok(await call(deps.backend, tenant, user, body, principal))

    return handle


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    name: str
    summary: str
    handler: Handler
    out: type[BaseModel] | None  # None: a free-form object
    body: type[BaseModel] | None = None
    keyed: bool = True
    body_required: bool = True


_USER = "/v1/tenants/{tenant}/users/{user}"
ROUTES: tuple[Route, ...] = (
    Route("GET", "/v1/health", "health", "Liveness and readiness", _health, Health,
          keyed=False),
    Route("GET", "/v1/openapi.json", "openapi", "This document", _openapi, None, keyed=False),
    Route("GET", "/v1/tools", "tools", "Agent tools as OpenAI tool definitions", _tools,
          ToolList),
    Route("GET", f"{_USER}/memories", "list_memories", "One page of the user's memories",
          _list, MemoryPage),
    Route("POST", f"{_USER}/search", "search", "Ranked memories for a query",
          _post(SearchRequest, lambda b, t, u, r, p: b.search(t, u, r)),
          SearchResponse, SearchRequest),
    Route("POST", f"{_USER}/context", "context", "Memories, core and session as a prompt block",
          _post(ContextRequest, lambda b, t, u, r, p: b.context(t, u, r)),
          ContextResponse, ContextRequest),
    Route("POST", f"{_USER}/feedback", "feedback", "Was a retrieved memory useful",
          _post(FeedbackRequest, lambda b, t, u, r, p: b.feedback(t, u, r)),
          Accepted, FeedbackRequest),
    Route("POST", f"{_USER}/tools/execute", "execute_tool", "Run one agent tool call",
          _post(ToolCallRequest, lambda b, t, u, r, p: b.execute_tool(t, u, r, p)),
          ToolResult, ToolCallRequest),
)


# History, corrections, forget-me and audit (their handlers live in http_governance,
# which imports this module's helpers: imported here, after they exist).
from memstream.web.http_governance import GOVERNANCE_ROUTES  # noqa: E402

ROUTES = ROUTES + GOVERNANCE_ROUTES
from memstream.web.http_inspector import INSPECTOR_ROUTES  # noqa: E402

ROUTES = ROUTES + INSPECTOR_ROUTES
from memstream.web.http_metrics import METRICS_ROUTES  # noqa: E402

ROUTES = ROUTES + METRICS_ROUTES


def build_http_app(backend: Backend, authoriser: Authoriser, *,
                   max_body_bytes: int = 65536) -> web.Application:
    # Imported here: the document describes ROUTES, so openapi.py imports this module.
    from memstream.web.openapi import openapi_document

    app = web.Application(middlewares=[_errors], client_max_size=max_body_bytes)
    app[_DEPS] = _Deps(backend, authoriser, max_body_bytes, openapi_document())
    for r in ROUTES:  # add_route, not add_get: no implicit HEAD routes outside the table
        app.router.add_route(r.method, r.path, r.handler, name=r.name)
    return app


# --- serving ---------------------------------------------------------------------------
class HttpServer:
    """The app on a TCP port, started and stopped by the worker. With ``port=0`` the OS picks
    a free port (give a literal address: "localhost" may bind two sockets, two ports)."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self._app, self._host, self._port = app, host, port
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
            await web.TCPSite(runner, self._host, self._port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = runner.addresses[0][1]

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
