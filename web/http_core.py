"""The core routes of the HTTP API: health, the OpenAPI document, the agent tools and one
user's memories (list, search, context, feedback, tool calls): their handlers and their
entries of the route table."""

from __future__ import annotations

from aiohttp import web

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import (
    Accepted,
    ContextRequest,
    ContextResponse,
    FeedbackRequest,
    Health,
    Live,
    MemoryPage,
    Principal,
    SearchRequest,
    SearchResponse,
    ToolCallRequest,
    ToolList,
    ToolResult,
)
from memstream.web.http_base import DEPS, Route
from memstream.web.http_checks import authenticate, list_params, ok, post, scope


async def _health(request: web.Request) -> web.StreamResponse:
    health = request.app[DEPS].backend.health()
    return ok(health, 200 if health.status == "ok" else 503)


async def _live(request: web.Request) -> web.StreamResponse:
    return ok(Live())


async def _openapi(request: web.Request) -> web.StreamResponse:
    return web.json_response(request.app[DEPS].openapi)


async def _tools(request: web.Request) -> web.StreamResponse:
    authenticate(request)
    return ok(ToolList(tools=request.app[DEPS].backend.tools()))


async def _whoami(request: web.Request) -> web.StreamResponse:
    return ok(authenticate(request))


async def _list(request: web.Request) -> web.StreamResponse:
    tenant, user, _ = scope(request)
    params = list_params(request.query)
    return ok(await request.app[DEPS].backend.list_memories(tenant, user, **params))


CORE_ROUTES: tuple[Route, ...] = (
    Route("GET", paths.HEALTH, "health", "Readiness: every owned partition served", _health,
          Health, keyed=False),
    Route("GET", paths.LIVE, "live", "Liveness: the process and its event loop run",
          _live, Live, keyed=False),
    Route("GET", paths.OPENAPI, "openapi", "This document", _openapi, None, keyed=False),
    Route("GET", paths.TOOLS, "tools", "Agent tools as OpenAI tool definitions", _tools,
          ToolList),
    Route("GET", paths.WHOAMI, "whoami", "Whom the key opens: its key id, tenant, admin",
          _whoami, Principal),
    Route("GET", paths.MEMORIES, "list_memories", "One page of the user's memories",
          _list, MemoryPage),
    Route("POST", paths.SEARCH, "search", "Ranked memories for a query",
          post(SearchRequest, lambda b, t, u, r, p, k: b.search(t, u, r)),
          SearchResponse, SearchRequest),
    Route("POST", paths.CONTEXT, "context", "Memories, core and session as a prompt block",
          post(ContextRequest, lambda b, t, u, r, p, k: b.context(t, u, r)),
          ContextResponse, ContextRequest),
    Route("POST", paths.FEEDBACK, "feedback", "Was a retrieved memory useful",
          post(FeedbackRequest, lambda b, t, u, r, p, k: b.feedback(t, u, r)),
          Accepted, FeedbackRequest, write=True),
    Route("POST", paths.EXECUTE_TOOL, "execute_tool", "Run one agent tool call",
          post(ToolCallRequest, lambda b, t, u, r, p, k: b.execute_tool(t, u, r, p, k)),
          ToolResult, ToolCallRequest, write=True),
)
