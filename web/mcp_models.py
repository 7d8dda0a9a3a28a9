"""The arguments and structured results of memstream's MCP tools
(:mod:`memstream.web.mcp_tools`): each tool's ``inputSchema`` and ``outputSchema``.
Arguments refuse unknown fields; every id is an :data:`~memstream.topics.schemas.Ident`
(ASCII letters, digits and ``. _ : @ + = -``, starting with a letter or digit), so no id can
carry a ``/``, a ``%``, ``..`` or a look-alike character into a path or a resource URI."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memstream.contract.http_api.intake import MAX_BATCH_MESSAGES
from memstream.memory.tools import CoreMemoryReplaceArgs, MemoryInsertArgs, MemorySearchArgs
from memstream.topics.schemas import MAX_QUERY_CHARS, Ident


# --- arguments -------------------------------------------------------------------------
class Who(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    user_id: Ident = Field(description="The user whose memory this is.")
    tenant_id: Ident | None = Field(
        None, description="The tenant (default: the key's own; a tenant key opens only "
                          "its own, the admin key must name one).")


class SearchArgs(MemorySearchArgs, Who):
    pass


class _Keyed(BaseModel):
    idempotency_key: Ident | None = Field(
        None, description="Optional: the same key sent again (a retry) is the same write, "
                          "made once; without it every call is a new write.")


class InsertArgs(_Keyed, MemoryInsertArgs, Who):
    session_id: Ident | None = Field(None, description="The conversation it came up in.")


class CoreReplaceArgs(_Keyed, CoreMemoryReplaceArgs, Who):
    pass


class ContextArgs(Who):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, pattern=r"\S",
                       description="What the next answer is about, in natural language.")
    session_id: Ident | None = Field(None, description="Adds this conversation's recent turns.")
    budget_tokens: int | None = Field(None, ge=1, le=250_000,
                                      description="At most this many tokens (estimated).")


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["user", "assistant"] = Field(description="Who said it.")
    content: str = Field(min_length=1, max_length=100_000,
                         description="What was said (data: stored, never obeyed).")
    message_id: Ident | None = Field(
        None, description="Optional: your id of this message, unique in the session "
                          "(default: derived from turn_id, its place and its text).")


class AddArgs(Who):
    session_id: Ident = Field(description="The conversation these turns belong to.")
    messages: list[Turn] = Field(min_length=1, max_length=MAX_BATCH_MESSAGES,
                                 description="The turns, oldest first.")
    turn_id: Ident | None = Field(
        None, description="Optional: your id of this exchange (e.g. its number in the "
                          "session). A call sent again with the same turns (a retry) is "
                          "taken once; give a turn_id when the same words may come again "
                          "in the session as a new exchange.")


class HistoryArgs(Who):
    memory_id: Ident = Field(description="A memory id, as search answers name them.")


class ForgetArgs(Who):
    reason: str = Field("", max_length=500,
                        description="Why (kept in the audit log; no personal content).")


# --- structured results (each tool's outputSchema) ---------------------------------------
class Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AgentToolOut(Out):
    status: Literal["ok", "queued", "error"] = Field(
        description="ok: done; queued: accepted, applied shortly; error: not done")
    query_id: str | None = Field(None, description="search: name it in feedback")
    memories: list[dict[str, Any]] | None = Field(None, description="search: the matches")
    job_id: str | None = Field(None, description="a write: its job")


class ContextOut(Out):
    query_id: str
    memory_ids: list[str] = Field(description="The memories in the block, best first.")


class AddOut(Out):
    message_ids: list[str] = Field(description="Each turn's id, in order (a retry: the same).")


class HistoryOut(Out):
    memory_id: str
    versions: int


class ForgetOut(Out):
    status: Literal["done", "queued", "failed"]
    job_id: str
