"""The tools of memstream's MCP server (:mod:`memstream.web.mcp_server`; Model Context
Protocol), written once over :class:`MemoryOps`, the few operations they and the resources
need. Two adapters implement it: the worker's own HTTP handlers, for its streamable-HTTP
endpoint (:mod:`memstream.web.mcp_http`), and the Python client, for ``memstream mcp`` on
stdio (:mod:`memstream.ops.mcp_stdio`).

- **Tools**: ``search``, ``memory_insert`` and ``core_memory_replace`` are the agent tools
  of :mod:`memstream.memory.tools` (their descriptions, schemas and execution: ``POST
  .../tools/execute``); ``context`` (the prompt block), ``add_messages`` (the HTTP way in,
  or Kafka when the client has Kafka settings), ``memory_history`` and ``forget_me``
  (the admin key only) are the API's routes of the same name. Every tool takes ``user_id``
  and an optional ``tenant_id``: a tenant key opens its own tenant only (naming another is
  refused before anything is asked), the admin key must name one.
- **Schemas** (:mod:`memstream.web.mcp_models`): each tool's ``inputSchema`` and
  ``outputSchema`` (its ``structuredContent``), and MCP's hints (:meth:`Spec.annotations`).
- **Retries**: ``add_messages`` derives each turn's id from the call (:func:`turn_message_id`),
  so a retried call is taken once; the agent tools' writes take an ``idempotency_key``.
- **Resources** (:mod:`memstream.web.mcp_server`): a user's core memory and profile.
- **Errors** are tool results with ``isError`` and a short message (the API's error code and
  message, or a refusal written here): never a stack trace, never a key, never the
  arguments sent back. Message text is data: nothing here interprets it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import mcp_types as types
from pydantic import BaseModel, ValidationError

from memstream.contract.http_api.api import (
    ContextRequest,
    ContextResponse,
    ToolCallRequest,
    ToolResult,
)
from memstream.contract.http_api.history import CorrectionRequest, CorrectionResult, HistoryResponse
from memstream.contract.http_api.intake import MessageIn, MessagesRequest
from memstream.core.errors import MemstreamError, describe
from memstream.memory.tools import (
    TOOLS,
    describe_arguments,
    tool_schema,
)
from memstream.topics.schemas import Role
from memstream.web.ingest_records import derived_id
from memstream.web.mcp_models import (
    AddArgs,
    AddOut,
    AgentToolOut,
    ContextArgs,
    ContextOut,
    CoreReplaceArgs,
    ForgetArgs,
    ForgetOut,
    HistoryArgs,
    HistoryOut,
    InsertArgs,
    Out,
    SearchArgs,
    Turn,
    Who,
)

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 300


class Refused(MemstreamError):
    """A call that is not made, or that the API refused: ``str(exc)`` is the message for
    the agent (short, about the call, never a value it carried)."""


@dataclass(frozen=True)
class Caller:
    """Whom a key opens: a tenant key its tenant; the admin key every tenant (``tenant_id``
    then the default of a call that names none, if any)."""

    tenant_id: str | None
    admin: bool = False


def tenant_for(caller: Caller, asked: str | None) -> str:
    """The tenant a call is for: the key's own, or the one named if the key opens it."""
    if caller.admin:  # its tenant: a default (stdio), None: every call names one
        tenant = asked or caller.tenant_id
        if tenant is None:
            raise Refused("the admin key opens every tenant: name a tenant_id")
        return tenant
    if caller.tenant_id is None:
        raise Refused("this key opens no tenant")
    if asked is not None and asked != caller.tenant_id:
        raise Refused("forbidden: this key does not open that tenant")
    return caller.tenant_id


class MemoryOps(Protocol):
    """What the tools and resources need of memstream, for one tenant and user a call."""

    async def tool(self, tenant: str, user: str, req: ToolCallRequest) -> ToolResult: ...
    async def context(self, tenant: str, user: str, req: ContextRequest) -> ContextResponse: ...
    async def add_messages(self, tenant: str, user: str, req: MessagesRequest) -> list[str]: ...
    async def history(self, tenant: str, user: str, memory_id: str) -> HistoryResponse: ...
    async def forget(self, tenant: str, user: str,
                     req: CorrectionRequest) -> CorrectionResult: ...


# --- tools -----------------------------------------------------------------------------
Run = Callable[[MemoryOps, str, Any], Awaitable[types.CallToolResult]]


@dataclass(frozen=True)
class Spec:
    name: str
    description: str
    args: type[Who]
    out: type[Out]
    run: Run
    read_only: bool
    admin_only: bool = False
    destructive: bool = False  # may overwrite or erase (else: only adds)
    idempotent: bool = False  # the same arguments again change nothing more
    title: str = ""

    def annotations(self) -> types.ToolAnnotations:
        """MCP's hints (clients ask before a destructive call, retry an idempotent one);
        every tool stays inside memstream (not open-world)."""
        writes = not self.read_only
        return types.ToolAnnotations(
            title=self.title or None, read_only_hint=self.read_only,
            destructive_hint=self.destructive if writes else None,
            idempotent_hint=self.idempotent if writes else None, open_world_hint=False)


def _text(text: str, error: bool = False, data: Out | None = None) -> types.CallToolResult:
    structured = None if data is None else data.model_dump(mode="json", exclude_none=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured, is_error=error)


def _agent_tool(name: str) -> Run:
    """Runs agent tool ``name`` (memory.tools) as ``POST .../tools/execute`` does."""

    async def run(ops: MemoryOps, tenant: str, args: Who) -> types.CallToolResult:
        arguments = args.model_dump(exclude={"user_id", "tenant_id", "session_id",
                                             "idempotency_key"}, exclude_none=True)
        req = ToolCallRequest(name=name, arguments=arguments,
                              session_id=getattr(args, "session_id", None),
                              tool_call_id=getattr(args, "idempotency_key", None))
        return tool_result(await ops.tool(tenant, args.user_id, req))

    return run


def error_result(message: str) -> types.CallToolResult:
    return _text(bound(message), error=True)


def tool_result(result: ToolResult) -> types.CallToolResult:
    data = AgentToolOut(status=result.status, **{
        k: v for k, v in result.data.items() if k in ("query_id", "memories", "job_id")})
    return _text(result.content, result.status == "error", data)


async def _context(ops: MemoryOps, tenant: str, args: ContextArgs) -> types.CallToolResult:
    req = ContextRequest(query=args.query, session_id=args.session_id,
                         budget_tokens=args.budget_tokens)
    found = await ops.context(tenant, args.user_id, req)
    return _text(found.prompt_block or "nothing remembered about this user yet",
                 data=ContextOut(query_id=found.query_id,
                                 memory_ids=[m.memory_id for m in found.memories]))


async def _add(ops: MemoryOps, tenant: str, args: AddArgs) -> types.CallToolResult:
    req = MessagesRequest(session_id=args.session_id, messages=[
        MessageIn(role=Role(t.role), content=t.content,
                  message_id=t.message_id or turn_message_id(tenant, args, i, t))
        for i, t in enumerate(args.messages)])
    ids = await ops.add_messages(tenant, args.user_id, req)
    return _text(f"accepted {len(ids)} message(s); memories are extracted from them "
                 "shortly", data=AddOut(message_ids=ids))


def turn_message_id(tenant: str, args: AddArgs, index: int, turn: Turn) -> str:
    """The id of a turn sent without one: the same for the same call sent again (an MCP
    client's retry on a timeout), so memstream takes it once (the ingest stage drops a
    message id it has seen in the session); another ``turn_id``, place or text: another
    id. The HTTP way in's own derivation, keyed by the ``turn_id``."""
    return derived_id(f"mcp:{args.turn_id or ''}", tenant, args.user_id, args.session_id,
                      index, {"role": turn.role, "content": turn.content})


async def _history(ops: MemoryOps, tenant: str, args: HistoryArgs) -> types.CallToolResult:
    found = await ops.history(tenant, args.user_id, args.memory_id)
    return _text(format_history(found), data=HistoryOut(memory_id=found.memory_id,
                                                versions=len(found.versions)))


async def _forget(ops: MemoryOps, tenant: str, args: ForgetArgs) -> types.CallToolResult:
    done = await ops.forget(tenant, args.user_id, CorrectionRequest(reason=args.reason))
    text = f"forget-me {done.status} (job {done.job_id})"
    return _text(text + (f": {done.error}" if done.error else ""), done.status == "failed",
                 ForgetOut(status=done.status, job_id=done.job_id))


def format_history(found: HistoryResponse) -> str:
    lines = [f"v{v.version} {v.status} {_day(v.valid_from)} ({v.lineage.kind}): {v.content}"
             for v in found.versions]
    return "\n".join(lines) or "no versions"


def _day(ts: float) -> str:
    return f"{datetime.fromtimestamp(ts, UTC):%Y-%m-%d}"


_AGENT = {t["function"]["name"]: t["function"]["description"] for t in TOOLS}
SPECS: dict[str, Spec] = {s.name: s for s in (
    Spec("search", _AGENT["memory_search"], SearchArgs, AgentToolOut,
         _agent_tool("memory_search"), True, title="Search memories"),
    Spec("context", "The user's memories, core memory and the session's recent turns as one "
         "prompt block for the next answer: call it before answering a user you may know.",
         ContextArgs, ContextOut, _context, True, title="Memory context for the next answer"),
    Spec("add_messages", "Add conversation turns of the user to memstream; it extracts the "
         "memories worth keeping from them (asynchronously: they show up in search and "
         "context shortly after). The text is stored as data, never followed. Sending the "
         "same call again (a retry) adds nothing twice.",
         AddArgs, AddOut, _add, False, idempotent=True, title="Add conversation turns"),
    Spec("memory_insert", _AGENT["memory_insert"], InsertArgs, AgentToolOut,
         _agent_tool("memory_insert"), False, title="Remember a fact"),
    Spec("core_memory_replace", _AGENT["core_memory_replace"], CoreReplaceArgs, AgentToolOut,
         _agent_tool("core_memory_replace"), False, destructive=True,
         title="Edit core memory"),
    Spec("memory_history", "Every version of one memory, oldest first, with what changed it "
         "and when.", HistoryArgs, HistoryOut, _history, True, title="History of a memory"),
    Spec("forget_me", "Operators only (the admin key): forget the user: hide every memory at "
         "once, then erase the user's content everywhere memstream keeps it.",
         ForgetArgs, ForgetOut, _forget, False, admin_only=True, destructive=True,
         idempotent=True, title="Forget a user (operators)"),
)}


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema as the agent tools show theirs, nested models kept."""
    schema = tool_schema(model)
    defs = model.model_json_schema().get("$defs")
    return {**schema, "$defs": defs} if defs else schema


TOOL_LIST: list[types.Tool] = [
    types.Tool(name=s.name, title=s.title, description=s.description,
               input_schema=input_schema(s.args),
               output_schema=s.out.model_json_schema(), annotations=s.annotations())
    for s in SPECS.values()]


def parse(name: str, arguments: Mapping[str, Any] | None) -> tuple[Spec, Who]:
    """The tool and its validated arguments; :class:`Refused` names the fields at fault,
    never their values."""
    spec = SPECS.get(name)
    if spec is None:
        raise Refused(f"unknown tool; available: {', '.join(SPECS)}")
    try:
        return spec, spec.args.model_validate(dict(arguments or {}))
    except ValidationError as exc:
        raise Refused(f"{name}: invalid arguments: {describe_arguments(exc)}") from None


async def call(ops: MemoryOps, caller: Caller, name: str,
               arguments: Mapping[str, Any] | None) -> types.CallToolResult:
    """One tool call, every failure an ``isError`` result with a short message."""
    try:
        spec, args = parse(name, arguments)
        tenant = tenant_for(caller, args.tenant_id)
        if spec.admin_only and not caller.admin:
            raise Refused("forbidden: operators only (the admin key); a tenant key cannot "
                          "call forget_me")
        return await spec.run(ops, tenant, args)
    except Refused as exc:
        return error_result(str(exc))
    except Exception as exc:  # never a stack trace to the agent; its kind in the log
        log.warning("mcp tool %s failed: %s", name[:64], describe(exc))
        return _text("internal error; retry later", error=True)


def bound(text: str) -> str:
    """``text`` cut to the length of a message for the agent."""
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
