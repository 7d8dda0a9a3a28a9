"""The HTTP contract (``/v1``): request and response bodies shared by the worker's API
(:mod:`memstream.web.http`) and the Python client (:mod:`memstream.client`).

Paths scope every call to one tenant and one user::

    GET  /v1/health                                         no key
    GET  /v1/openapi.json                                   no key
    GET  /v1/tools                                          OpenAI tool definitions
    GET  /v1/tenants/{tenant}/users/{user}/memories         ?limit=&cursor=&status=&type=
    POST /v1/tenants/{tenant}/users/{user}/search           SearchRequest -> SearchResponse
    POST /v1/tenants/{tenant}/users/{user}/context          ContextRequest -> ContextResponse
    POST /v1/tenants/{tenant}/users/{user}/feedback         FeedbackRequest -> Accepted
    POST /v1/tenants/{tenant}/users/{user}/tools/execute    ToolCallRequest -> ToolResult

Keys: ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``; a tenant key opens its own
tenant only (another tenant: 403), the admin key every tenant. Errors are
:class:`ErrorBody` with a stable ``code``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memstream.contract.records import MAX_QUERY_CHARS, Ident

# MAX_QUERY_CHARS: contract.records (the agent tools share it)
StatusName = Literal["active", "archived", "superseded", "deleted"]
MAX_K = 50
MAX_PAGE = 500


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # tolerant client


class ErrorCode(StrEnum):
    UNAUTHORIZED = "unauthorized"  # 401: no key, or an unknown / revoked one
    FORBIDDEN = "forbidden"  # 403: the key is bound to another tenant
    BAD_REQUEST = "bad_request"  # 400: invalid path id, parameter or body
    NOT_FOUND = "not_found"  # 404: no such route / tool / memory
    PAYLOAD_TOO_LARGE = "payload_too_large"  # 413
    METHOD_NOT_ALLOWED = "method_not_allowed"  # 405
    UNAVAILABLE = "unavailable"  # 503: the store or the broker is not ready
    RATE_LIMITED = "rate_limited"  # 429: too many failed key checks (see Retry-After)
    INTERNAL = "internal"  # 500


class ErrorDetail(_Out):
    code: ErrorCode
    message: str


class ErrorBody(_Out):
    error: ErrorDetail


# --- memories --------------------------------------------------------------------------


class MemoryOut(_Out):
    """One memory version as the API shows it."""

    memory_id: str
    version: int
    type: str  # semantic | episodic | procedural
    content: str
    importance: int
    status: str  # active | superseded | archived | deleted
    scope: Literal["user", "global"]
    slot: str | None = None
    created_at: float
    updated_at: float
    valid_from: float
    valid_to: float | None = None
    expires_at: float | None = None
    last_accessed_at: float | None = None
    access_count: int = 0


class ScoredMemory(MemoryOut):
    score: float
    recency: float
    importance_score: float
    relevance: float


class TurnContext(_Out):
    role: str
    content: str


class Successor(_Out):
    """The live memory that replaced what an archived turn stated."""

    memory_id: str
    version: int
    content: str
    event_time: float  # when it was stated (epoch s)


class RecallItem(_Out):
    """One fused result: a memory, or an archived turn of an earlier conversation."""

    kind: Literal["memory", "turn"]
    id: str
    content: str
    score: float  # the fusion's: a memory that answers the query above 1, ahead of turns
    event_time: float  # when it was said (a memory: the statement's, else valid_from), epoch s
    session_id: str
    message_ids: list[str]  # its lineage: the messages it came from
    role: str | None = None  # a turn's speaker
    context: TurnContext | None = None  # a turn's previous turn in its session
    line: str | None = None  # what the prompt block shows of it (context answers)
    # a turn whose statement is no longer true: how it ended, when (epoch s), and the live
    # memory that holds the value now (superseded: what replaced it)
    stale: Literal["superseded", "deleted", "expired"] | None = None
    valid_to: float | None = None
    superseded_by: Successor | None = None
    # a memory the user said something newer about (the id of that turn, ranked above it):
    # it is shown as dated evidence, not as what is true now
    newer_turn: str | None = None


class MemoryPage(_Out):
    memories: list[MemoryOut]
    next_cursor: str | None = None  # pass as ``cursor`` for the next page


# --- search / context --------------------------------------------------------------------


class SearchRequest(_Body):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    k: int | None = Field(None, ge=1, le=MAX_K, description="default: settings.retrieval_k")
    include_global: bool = True
    statuses: list[StatusName] = Field(
        ["active"], description="Archived / superseded / deleted come back only when asked for")
    include_expired: bool = False
    record_hits: bool = True
    sources: Literal["fused", "memories", "turns"] = Field(
        "fused", description="What ``items`` fuses: memories and archived turns, or one kind")
    turn_match: Literal["hybrid", "dense", "sparse"] = Field(
        "hybrid", description="How turns are found: by meaning and words, or one of them")
    recency: bool = Field(True, description="Recency counts in the ranking")


class SearchResponse(_Out):
    query_id: str  # name it in feedback calls
    memories: list[ScoredMemory]
    procedural: list[MemoryOut] = Field(default_factory=list)
    # memories and archived turns fused, best first (only memories when the archive is off)
    items: list[RecallItem] = Field(default_factory=list)


class WindowMessage(_Out):
    seq: int
    message_id: str
    role: str
    content: str
    ts: str  # ISO 8601


class ContextRequest(_Body):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    session_id: Ident | None = Field(None, description="Adds this session's recent turns")
    k: int | None = Field(None, ge=1, le=MAX_K)
    budget_chars: int | None = Field(None, ge=1, le=1_000_000)
    budget_tokens: int | None = Field(None, ge=1, le=250_000)
    record_hits: bool = True


class ContextResponse(_Out):
    query_id: str
    memories: list[ScoredMemory]
    procedural: list[MemoryOut]
    core: dict[str, str]  # label -> text of the user's core memory blocks
    window: list[WindowMessage]
    prompt_block: str
    truncated: bool = False  # the budget left some memories out
    items: list[RecallItem] = Field(default_factory=list)  # what the prompt block holds, fused


class FeedbackRequest(_Body):
    query_id: str = Field(min_length=1, max_length=128)
    memory_id: str = Field(min_length=1, max_length=128)
    useful: bool


class Accepted(_Out):
    accepted: bool = True
    id: str | None = None


class Live(_Out):
    """``alive``: the worker's process and event loop run (``/v1/live``, the liveness
    probe), whether or not it is ready (``/v1/health``)."""

    status: Literal["alive"] = "alive"


class Health(_Out):
    """``ok``: every partition this worker owns is restored and served (or it owns none and
    answers by forwarding); ``starting``: not yet, ``restoring`` names the partitions."""

    status: Literal["ok", "starting"]
    owned: list[int] = Field(default_factory=list)  # partitions this worker owns
    restoring: list[int] = Field(default_factory=list)  # owned, still being restored
    forwarding: bool = False  # owns none: every user's requests go to their owner
    waiting: list[str] = Field(default_factory=list)  # e.g. "joining", "user-keys"


# --- agent tools -------------------------------------------------------------------------


class ToolList(_Out):
    tools: list[dict[str, Any]]  # OpenAI "tools" entries


class ToolCallRequest(_Body):
    name: str = Field(min_length=1, max_length=64)
    arguments: dict[str, Any] | str = Field(
        default_factory=dict, description="An object, or the JSON string a model produced")
    session_id: Ident | None = None
    tool_call_id: str | None = Field(None, max_length=128)
    wait_s: float = Field(5.0, ge=0, le=30, description="Writes: wait this long for apply")


class ToolResult(_Out):
    tool_call_id: str | None = None
    name: str
    status: Literal["ok", "queued", "error"]
    content: str  # what to hand back to the model as the tool message
    data: dict[str, Any] = Field(default_factory=dict)


class Principal(_Out):
    """Who a presented key belongs to: one tenant, or the operator (admin: every tenant)."""

    key_id: str
    tenant_id: str | None = None  # None only for the admin key
    admin: bool = False

    def may_open(self, tenant_id: str) -> bool:
        return self.admin or self.tenant_id == tenant_id
