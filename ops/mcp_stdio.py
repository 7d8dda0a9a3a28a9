"""``memstream mcp``: memstream's MCP server on stdio, for a desktop agent (Claude Desktop,
Cursor, ...): the tools and resources of :mod:`memstream.web.mcp_tools` over the Python
client (:class:`~memstream.client.AsyncMemoryClient`), which talks to one or more workers'
HTTP API with a tenant key.

The tenant is the key's (``GET /v1/whoami``, asked at the first call, so the agent may start
before the workers); the admin key may name a default tenant. Turns go through the HTTP way
in, or to Kafka with ``--kafka`` (the ``MEMSTREAM_BOOTSTRAP_SERVERS`` / SASL / TLS settings).
stdout is the protocol: every log line goes to stderr.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import httpx
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from memstream.client import AsyncMemoryClient, MemstreamAPIError, MemstreamConnectionError
from memstream.contract.http_api import paths
from memstream.contract.http_api.api import (
    ContextRequest,
    ContextResponse,
    Principal,
    ToolCallRequest,
    ToolResult,
)
from memstream.contract.http_api.history import CorrectionRequest, CorrectionResult, HistoryResponse
from memstream.contract.http_api.intake import MessagesRequest
from memstream.core.settings import Settings
from memstream.web.mcp_server import build_server
from memstream.web.mcp_tools import Caller, MemoryOps, Refused

log = logging.getLogger(__name__)
T = TypeVar("T")
UNREACHABLE = "memstream could not be reached; retry later"


class ClientOps:
    """:class:`~memstream.web.mcp_tools.MemoryOps` over a client of one tenant."""

    def __init__(self, client: AsyncMemoryClient) -> None:
        self.client = client

    async def _do(self, tenant: str, call: Awaitable[T]) -> T:
        if tenant != self.client.tenant_id:
            close = getattr(call, "close", None)
            if close is not None:
                close()  # never awaited: no "never awaited" warning either
            raise Refused("forbidden: this server opens one tenant only")
        try:
            return await call
        except MemstreamAPIError as exc:
            raise Refused(f"{exc.code}: {exc.message}") from None
        except MemstreamConnectionError:
            raise Refused(UNREACHABLE) from None
        except ValueError:  # the client's own checks; their text may quote a value
            raise Refused("invalid request") from None

    async def tool(self, tenant: str, user: str, req: ToolCallRequest) -> ToolResult:
        return await self._do(tenant, self.client.execute_tool(
            req.name, req.arguments, user_id=user, session_id=req.session_id,
            wait_s=req.wait_s))

    async def context(self, tenant: str, user: str, req: ContextRequest) -> ContextResponse:
        return await self._do(tenant, self.client.context(
            req.query, user_id=user, session_id=req.session_id, limit=req.k,
            budget_chars=req.budget_chars, budget_tokens=req.budget_tokens,
            record_hits=req.record_hits))

    async def add_messages(self, tenant: str, user: str, req: MessagesRequest) -> list[str]:
        turns = [{"role": m.role.value, "content": m.content, "message_id": m.message_id}
                 for m in req.messages]  # the tool's ids: a retried call is taken once
        return await self._do(tenant, self.client.add(turns, user_id=user,
                                                      session_id=req.session_id or "mcp"))

    async def history(self, tenant: str, user: str, memory_id: str) -> HistoryResponse:
        return await self._do(tenant, self.client.history(memory_id, user_id=user))

    async def forget(self, tenant: str, user: str,
                     req: CorrectionRequest) -> CorrectionResult:
        return await self._do(tenant, self.client.forget(user_id=user, reason=req.reason,
                                                         wait_s=req.wait_s))


async def whoami(urls: Sequence[str], key: str, timeout: float = 10.0) -> Principal:
    """Whom ``key`` opens, asked of the first worker that answers."""
    for url in urls:
        try:
            async with httpx.AsyncClient(timeout=timeout) as http:
                r = await http.get(url.rstrip("/") + paths.WHOAMI,
                                   headers={"Authorization": f"Bearer {key}"})
        except httpx.HTTPError:
            continue
        if r.status_code in (401, 403):
            raise Refused("the API key was refused (MEMSTREAM_API_KEY)")
        if r.status_code == 200:
            return Principal.model_validate_json(r.content)
    raise Refused(UNREACHABLE)


class StdioSession:
    """The client and the caller, made at the first call that needs them."""

    def __init__(self, urls: Sequence[str], key: str, tenant: str | None,
                 kafka: Settings | None) -> None:
        self.urls, self.key, self.tenant, self.kafka = list(urls), key, tenant, kafka
        self.ops: ClientOps | None = None
        self.caller: Caller | None = None
        self._lock = asyncio.Lock()

    async def resolve(self, ctx: ServerRequestContext[Any, Any]) -> tuple[MemoryOps, Caller]:
        async with self._lock:
            if self.ops is None or self.caller is None:
                principal = await whoami(self.urls, self.key)
                tenant = principal.tenant_id or self.tenant
                if tenant is None:
                    raise Refused("the admin key needs a tenant: --tenant / MEMSTREAM_TENANT")
                if principal.tenant_id is not None and self.tenant not in (None, tenant):
                    raise Refused("forbidden: the API key does not open MEMSTREAM_TENANT")
                prefix = self.kafka.topic_prefix if self.kafka else "memstream"
                client = AsyncMemoryClient(self.urls, self.key, tenant_id=tenant,
                                           kafka=self.kafka, topic_prefix=prefix)
                self.ops, self.caller = ClientOps(client), Caller(tenant, principal.admin)
            return self.ops, self.caller

    async def close(self) -> None:
        if self.ops is not None:
            await self.ops.client.aclose()


async def serve(urls: Sequence[str], key: str, tenant: str | None = None,
                kafka: Settings | None = None) -> None:
    """The MCP server on this process's stdin / stdout until the agent closes them."""
    session = StdioSession(urls, key, tenant, kafka)
    server = build_server(session.resolve)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        await session.close()
