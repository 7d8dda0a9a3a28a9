"""memstream's MCP server (the official ``mcp`` SDK's low-level ``Server``): the tools of
:mod:`memstream.web.mcp_tools` and the resources, a user's core memory and profile block by
URI template (:data:`CORE_URI`, :data:`PROFILE_URI`, and the same under
``memstream://tenants/{tenant_id}/``), over :class:`~memstream.web.mcp_tools.MemoryOps`.

A resource that cannot be read is a JSON-RPC error with a short message (there is no
``isError`` for resources); a tool call that fails is an ``isError`` result.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from importlib import metadata
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from memstream.contract.http_api.api import ContextRequest
from memstream.core.errors import describe
from memstream.topics.schemas import ID_PATTERN
from memstream.web.mcp_tools import (
    TOOL_LIST,
    Caller,
    MemoryOps,
    Refused,
    bound,
    call,
    error_result,
    parse,
    tenant_for,
)

log = logging.getLogger(__name__)

SERVER_NAME = "memstream"
CORE_URI = "memstream://users/{user_id}/core-memory"
PROFILE_URI = "memstream://users/{user_id}/profile"
_URI = re.compile(r"memstream://(?:tenants/(?P<tenant>[^/]+)/)?users/(?P<user>[^/]+)/"
                  r"(?P<what>core-memory|profile)")
INSTRUCTIONS = ("memstream is the user's long-term memory. Call context before answering, "
                "add_messages after each exchange, search for specific facts.")


# --- resources -------------------------------------------------------------------------
TEMPLATES = [
    types.ResourceTemplate(name="core-memory", uri_template=CORE_URI, mime_type="text/plain",
                           description="The user's core memory: every always-visible block "
                                       "(profile, instructions)."),
    types.ResourceTemplate(name="profile", uri_template=PROFILE_URI, mime_type="text/plain",
                           description="The user's profile: who the user is (core memory)."),
    types.ResourceTemplate(name="tenant-core-memory", mime_type="text/plain",
                           uri_template="memstream://tenants/{tenant_id}/users/{user_id}/"
                                        "core-memory",
                           description="Core memory of a user of a named tenant."),
    types.ResourceTemplate(name="tenant-profile", mime_type="text/plain",
                           uri_template="memstream://tenants/{tenant_id}/users/{user_id}/"
                                        "profile",
                           description="Profile of a user of a named tenant."),
]


def parse_uri(uri: str) -> tuple[str | None, str, str]:
    """(tenant or None, user, "core-memory" | "profile") of a resource URI."""
    m = _URI.fullmatch(uri)
    if m is None:
        raise Refused("unknown resource; see resources/templates/list")
    tenant, user = m["tenant"], m["user"]
    if not ID_PATTERN.fullmatch(user) or (tenant is not None and not ID_PATTERN.fullmatch(tenant)):
        raise Refused("invalid id in the resource URI")
    return tenant, user, m["what"]


def format_core(core: Mapping[str, str], what: str) -> str:
    if what == "profile":
        return core.get("profile", "")
    return "\n\n".join(f"[{label}]\n{text}" for label, text in sorted(core.items()) if text)


async def read(ops: MemoryOps, caller: Caller, uri: str) -> str:
    asked, user, what = parse_uri(uri)
    tenant = tenant_for(caller, asked)
    found = await ops.context(tenant, user, ContextRequest(query="core memory", k=1,
                                                           record_hits=False))
    return format_core(found.core, what)


# --- the server --------------------------------------------------------------------------
Resolve = Callable[[ServerRequestContext[Any, Any]], Awaitable[tuple[MemoryOps, Caller]]]


def package_version() -> str:
    """memstream's installed version (the server's ``serverInfo``)."""
    try:
        return metadata.version("memstream")
    except metadata.PackageNotFoundError:
        return ""


def build_server(resolve: Resolve, version: str | None = None) -> Server[Any]:
    """The MCP server; ``resolve`` gives each request its :class:`MemoryOps` and
    :class:`Caller` (fixed on stdio; from the HTTP request on the worker)."""

    async def list_tools(ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOL_LIST)

    async def call_tool(ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            parse(params.name, params.arguments)  # a bad call is answered before the
            ops, caller = await resolve(ctx)  # caller is resolved (stdio: asks a worker)
        except Refused as exc:
            return error_result(str(exc))
        return await call(ops, caller, params.name, params.arguments)

    async def list_resources(ctx: ServerRequestContext[Any, Any],
                             params: types.PaginatedRequestParams | None,
                             ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])

    async def list_templates(ctx: ServerRequestContext[Any, Any],
                             params: types.PaginatedRequestParams | None,
                             ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=TEMPLATES)

    async def read_resource(ctx: ServerRequestContext[Any, Any],
                            params: types.ReadResourceRequestParams,
                            ) -> types.ReadResourceResult:
        uri = str(params.uri)
        try:
            ops, caller = await resolve(ctx)
            text = await read(ops, caller, uri)
        except Refused as exc:
            raise MCPError(types.INVALID_PARAMS, bound(str(exc))) from None
        except Exception as exc:
            log.warning("mcp resource read failed: %s", describe(exc))
            raise MCPError(types.INTERNAL_ERROR, "internal error; retry later") from None
        return types.ReadResourceResult(contents=[
            types.TextResourceContents(uri=uri, mime_type="text/plain", text=text)])

    return Server(SERVER_NAME, version=package_version() if version is None else version,
                  instructions=INSTRUCTIONS, on_list_tools=list_tools,
                  on_call_tool=call_tool, on_list_resources=list_resources,
                  on_list_resource_templates=list_templates, on_read_resource=read_resource)
