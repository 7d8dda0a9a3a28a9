"""The worker's MCP endpoint: ``/mcp`` on the HTTP API's own port (streamable HTTP,
stateless, JSON answers), for remote agents.

- **Bridge**: aiohttp hands the request to the SDK's
  :class:`~mcp.server.streamable_http_manager.StreamableHTTPSessionManager` as an ASGI call
  (:class:`_Exchange`: the body it read in, the SDK's JSON answer back out), so the SDK's
  own transport speaks the protocol; no second server, no second port.
- **Keys**: checked before the SDK sees anything, exactly as the API checks them
  (:func:`memstream.web.http_checks.authenticate`: Bearer or ``X-API-Key``, 401, the
  failed-login limit and the key's request rate, 429); the key itself is not passed on.
- **Calls**: every operation is the API's own route, run in-process through the app's
  handler chain (:class:`InApp`, :func:`dispatch`): the same tenant check (403), readiness
  (503), forwarding to the user's owner and standby reads, idempotency keys and error
  messages. The caller's principal rides along on the request, so a tool call is one
  request of the key's rate.
- **Origin / Host** (the MCP spec's DNS-rebinding rule): a request with an ``Origin``
  header (a browser page) is 403 unless that origin is allowed (``mcp_allowed_origins``,
  empty by default); agents' HTTP clients (Claude, Cursor, the OpenAI Agents SDK) send
  none. ``Host`` is not checked (the SDK's ``allowed_hosts``): every call needs a key that
  a rebinding page cannot present (browsers attach no ``Authorization`` by themselves), and
  a Host allow-list would break every proxy and ingress name in front of the worker.
- **Stateless**: no session is kept, so any worker answers any request (a load balancer in
  front of several workers needs no affinity).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, MutableMapping
from typing import Any, TypeVar

from aiohttp import web
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR
from multidict import CIMultiDict
from pydantic import BaseModel, ValidationError

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import (
    ContextRequest,
    ContextResponse,
    ErrorBody,
    ErrorCode,
    ToolCallRequest,
    ToolResult,
)
from memstream.contract.http_api.history import CorrectionRequest, CorrectionResult, HistoryResponse
from memstream.contract.http_api.intake import MessagesAccepted, MessagesRequest
from memstream.web.http_base import DEPS, ApiError
from memstream.web.http_checks import BODY_READ, authenticate, read_body
from memstream.web.mcp_server import build_server
from memstream.web.mcp_tools import Caller, MemoryOps, Refused

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
CALL = "memstream.mcp_call"  # the ASGI scope's key of (MemoryOps, Caller)
_HIDDEN = frozenset({"authorization", "x-api-key"})  # the SDK never sees a key
M = TypeVar("M", bound=BaseModel)


class InApp:
    """:class:`~memstream.web.mcp_tools.MemoryOps` over this worker's own route handlers,
    for the caller of one ``/mcp`` request (see the module doc)."""

    def __init__(self, request: web.Request) -> None:
        self._request = request

    async def _call(self, method: str, path: str, body: BaseModel | None,
                    out: type[M]) -> M:
        data = b"" if body is None else body.model_dump_json(exclude_none=True).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "Content-Length": str(len(data)),
                   "Host": self._request.headers.get("Host", "localhost")}
        sub = self._request.clone(method=method, rel_url=path, headers=headers)
        sub[BODY_READ] = data  # the principal is the /mcp request's (cloned with its state)
        response = await dispatch(self._request.app, sub)
        payload = response.body if isinstance(response, web.Response) else None
        if not isinstance(payload, bytes):
            raise Refused("internal error: unexpected answer")
        if response.status >= 400:
            raise Refused(api_error(response.status, payload))
        return out.model_validate_json(payload)

    async def tool(self, tenant: str, user: str, req: ToolCallRequest) -> ToolResult:
        path = paths.fill(paths.EXECUTE_TOOL, tenant=tenant, user=user)
        return await self._call("POST", path, req, ToolResult)

    async def context(self, tenant: str, user: str, req: ContextRequest) -> ContextResponse:
        path = paths.fill(paths.CONTEXT, tenant=tenant, user=user)
        return await self._call("POST", path, req, ContextResponse)

    async def add_messages(self, tenant: str, user: str, req: MessagesRequest) -> list[str]:
        path = paths.fill(paths.MESSAGES, tenant=tenant, user=user)
        done = await self._call("POST", path, req, MessagesAccepted)
        return [m.message_id for m in done.messages]

    async def history(self, tenant: str, user: str, memory_id: str) -> HistoryResponse:
        path = paths.fill(paths.MEMORY_HISTORY, tenant=tenant, user=user, memory_id=memory_id)
        return await self._call("GET", path, None, HistoryResponse)

    async def forget(self, tenant: str, user: str,
                     req: CorrectionRequest) -> CorrectionResult:
        path = paths.fill(paths.FORGET, tenant=tenant, user=user)
        return await self._call("POST", path, req, CorrectionResult)


async def dispatch(app: web.Application, sub: web.Request) -> web.StreamResponse:
    """``sub`` through ``app`` as a request from the network: route match, then every
    middleware (errors, ingress: idempotency keys; the router: forwarding to the user's
    owner, standby reads) around the route's handler (key, path ids, tenant 403,
    readiness 503).

    This is the one place memstream calls a private aiohttp method,
    ``Application._handle``, on purpose, pinned by
    ``tests/unit/web/test_mcp_http.py::test_the_in_process_dispatch_is_the_apps_own``.
    aiohttp has no public way to run a request through an application in-process: a
    route's ``match_info`` can only be attached by the application itself, and the
    middlewares (forwarding, idempotency) and the handlers' checks all read it. The public
    alternatives lose more than they keep: a loopback HTTP request to the worker's own
    port needs the caller's key on a second hop (the SDK never sees it), counts every tool
    call twice against the key's rate and failed-login limits, needs the worker's own TLS
    trust and a connectable address for 0.0.0.0 binds; calling the :class:`Backend`
    directly would re-implement, and so drift from, the checks and the forwarding the
    routes and middlewares do."""
    return await app._handle(sub)


def api_error(status: int, payload: bytes) -> str:
    """An error answer of the API as one line for the agent: its code and message."""
    try:
        error = ErrorBody.model_validate_json(payload).error
    except ValidationError:
        return f"HTTP {status}"
    return f"{error.code.value}: {error.message}"


async def _resolve(ctx: ServerRequestContext[Any, Any]) -> tuple[MemoryOps, Caller]:
    found = getattr(ctx.request, "scope", {}).get(CALL)
    if found is None:  # only requests through McpEndpoint.handle reach the server
        raise MCPError(INTERNAL_ERROR, "no caller")
    ops, caller = found
    return ops, caller


class _Exchange:
    """One ASGI call's ``receive`` and ``send`` over an aiohttp request: the body read
    beforehand, the answer (one JSON body: POST only, JSON answers) collected and returned
    as a plain response, which the app's middlewares may still add headers to."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.status, self.headers = 500, CIMultiDict[str]()
        self.chunks: list[bytes] = []
        self.done = asyncio.Event()
        self._given = False

    async def receive(self) -> dict[str, Any]:
        if not self._given:
            self._given = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.done.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = CIMultiDict((k.decode("latin-1"), v.decode("latin-1"))
                                       for k, v in message.get("headers", ())
                                       if k.lower() != b"content-length")
        elif message["type"] == "http.response.body" and not self.done.is_set():
            self.chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                self.done.set()

    def answer(self) -> web.Response:
        self.done.set()
        return web.Response(status=self.status, headers=self.headers,
                            body=b"".join(self.chunks))


def scope_of(request: web.Request, body: bytes, call: tuple[MemoryOps, Caller]
             ) -> dict[str, Any]:
    """The ASGI HTTP scope of ``request`` (no key header), carrying ``call``."""
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
               for k, v in request.headers.items() if k.lower() not in _HIDDEN]
    if not any(k == b"content-length" for k, _ in headers):
        headers.append((b"content-length", str(len(body)).encode()))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": request.method, "scheme": request.scheme, "path": request.path,
            "raw_path": request.raw_path.split("?", 1)[0].encode("latin-1"),
            "query_string": request.query_string.encode("latin-1"), "root_path": "",
            "headers": headers, "client": (request.remote or "", 0),
            "server": (request.url.host or "", request.url.port or 0), "state": {},
            CALL: call}


class McpEndpoint:
    """The SDK's session manager (stateless, JSON answers) run for the worker's lifetime,
    and the aiohttp handler of :data:`MCP_PATH`."""

    def __init__(self, max_body_bytes: int = 65536,
                 allowed_origins: Collection[str] = ()) -> None:
        self.server = build_server(_resolve)
        self.max_body_bytes = max_body_bytes
        self.allowed_origins = frozenset(allowed_origins)
        self._manager: StreamableHTTPSessionManager | None = None
        self._running: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def attach(self, app: web.Application) -> None:
        # POST only: stateless, there is no session to DELETE and no standalone SSE stream
        # to GET (405 tells an MCP client so; an open GET would hold a task per caller)
        app.router.add_route("POST", MCP_PATH, self.handle, name="mcp")

    async def start(self) -> None:
        """The manager's task group, held open by a task until :meth:`stop`."""
        if self._task is not None:
            return
        manager = StreamableHTTPSessionManager(self.server, json_response=True, stateless=True,
                                               max_request_body_size=self.max_body_bytes)
        loop = asyncio.get_running_loop()
        started, self._running = loop.create_future(), loop.create_future()
        running = self._running

        async def hold() -> None:
            async with manager.run():
                started.set_result(None)
                await running

        self._task = asyncio.create_task(hold(), name="mcp-endpoint")
        await asyncio.wait([started, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not started.done():  # it failed to start: its error
            self._task.result()
        self._manager = manager

    async def stop(self) -> None:
        task, self._task, self._manager = self._task, None, None
        if task is None:
            return
        if self._running is not None and not self._running.done():
            self._running.set_result(None)
        await asyncio.gather(task, return_exceptions=True)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self.allowed_origins:
            # the MCP spec's DNS-rebinding rule: an Origin present and not allowed is 403
            raise ApiError(403, ErrorCode.FORBIDDEN, "this Origin may not call /mcp "
                           "(MEMSTREAM_MCP_ALLOWED_ORIGINS)")
        principal = authenticate(request)  # 401 / 429 as the API answers them
        manager = self._manager
        if manager is None:
            raise ApiError(503, ErrorCode.UNAVAILABLE, "starting, retry later")
        limit = request.app[DEPS].max_body_bytes
        body = await read_body(request, limit)
        caller = Caller(principal.tenant_id, principal.admin)
        exchange = _Exchange(body)
        await manager.handle_request(scope_of(request, body, (InApp(request), caller)),
                                     exchange.receive, exchange.send)
        return exchange.answer()
