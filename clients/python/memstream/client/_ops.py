"""The client's HTTP operations, sans-I/O: request building and response parsing.

Each operation is written once, as a generator that yields a :class:`Call` and receives its
:class:`~memstream.client._http.Response`, so the sync and the async client only differ in
the few lines that actually do I/O (their ``_run``, which meets the operations in :func:`advance`).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast
from urllib.parse import urlencode

from pydantic import BaseModel, ValidationError

from memstream.client._errors import MemstreamAPIError, MemstreamConnectionError
from memstream.client._http import ConnectError, Request, Response, TransportError, encode_json
from memstream.contract.exceptions import MemstreamError
from memstream.contract.http_api import paths
from memstream.contract.http_api.api import (
    MAX_PAGE,
    Accepted,
    ContextRequest,
    ContextResponse,
    ErrorBody,
    ErrorCode,
    FeedbackRequest,
    MemoryOut,
    MemoryPage,
    SearchRequest,
    SearchResponse,
    ToolCallRequest,
    ToolResult,
)
from memstream.contract.http_api.intake import (
    MessageIn,
    MessagesAccepted,
    MessagesRequest,
    SessionEndAccepted,
)
from memstream.contract.records import ID_PATTERN, ChatMessage

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Sources = Literal["fused", "memories", "turns"]  # what a search's ``items`` fuses
TurnMatch = Literal["hybrid", "dense", "sparse"]  # how it finds archived turns

_MAX_ERROR_TEXT = 300  # of a non-JSON error body: enough to recognise, never a whole page
_STATUS_CODES = {401: ErrorCode.UNAUTHORIZED, 403: ErrorCode.FORBIDDEN,
                 400: ErrorCode.BAD_REQUEST, 404: ErrorCode.NOT_FOUND,
                 405: ErrorCode.METHOD_NOT_ALLOWED, 413: ErrorCode.PAYLOAD_TOO_LARGE,
                 500: ErrorCode.INTERNAL, 503: ErrorCode.UNAVAILABLE}


IDEMPOTENCY_KEY = "Idempotency-Key"
HTTP_BATCH = 64  # messages per request of the HTTP way in: the default dedup_window


def new_key() -> str:
    """A write's idempotency key: one per call, sent again on every retry of it."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    params: dict[str, str | int] | None = None
    json: dict[str, Any] | None = None
    min_timeout: float | None = None  # the server may hold this call this long (tool writes)
    idempotency_key: str | None = None  # a write's: the same on every worker it is tried on

    def request(self, base_url: str, headers: Mapping[str, str], timeout: float) -> Request:
        """The request to one worker (``base_url``), with the client's ``headers``."""
        url = base_url + self.path
        if self.params:
            url += "?" + urlencode(self.params)
        sent = dict(headers)
        content = None
        if self.json is not None:
            content = encode_json(self.json)
            sent["Content-Type"] = "application/json"
        if self.idempotency_key is not None:
            sent[IDEMPOTENCY_KEY] = self.idempotency_key
        if self.min_timeout is not None:
            timeout = max(timeout, self.min_timeout)
        return Request(self.method, url, sent, content, timeout)


@dataclass(frozen=True)
class Done(Generic[T]):
    value: T


Op = Generator[Call, Response, T]


def check_id(name: str, value: str) -> str:
    """Ids go into URL paths and record keys: refuse a bad one before anything is sent."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise ValueError(f"{name} must be 1-128 letters, digits or . _ : @ + = - "
                         "(no '/', no spaces), starting with a letter or digit")
    return value


def user_path(route: str, tenant_id: str, user_id: str, **ids: str) -> str:
    """``route`` (a constant of :mod:`memstream.contract.http_api.paths`) for one user; the caller
    checks the other ids first, ``user_id`` is checked here (the tenant's, by the client)."""
    return paths.fill(route, tenant=tenant_id, user=check_id("user_id", user_id), **ids)


def _body(request: BaseModel) -> dict[str, Any]:
    """Only what the caller set: the server's defaults (``k``, statuses, ...) stay its own."""
    return request.model_dump(mode="json", exclude_unset=True, exclude_none=True)


def parse(response: Response, model: type[M]) -> M:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise MemstreamError(f"unexpected {model.__name__} from the API: "
                             f"{exc.error_count()} validation error(s)") from exc


def api_error(status: int, content: bytes, secret: str = "") -> MemstreamAPIError:
    """The error of an unsuccessful answer: its :class:`ErrorBody`, else the status alone."""
    try:
        detail = ErrorBody.model_validate_json(content).error
        code, message = detail.code.value, detail.message
    except ValidationError:  # a proxy's HTML page, an empty body, a newer code
        code = _STATUS_CODES.get(status, "http_error")
        text = content.decode("utf-8", errors="replace").strip()
        message = text[:_MAX_ERROR_TEXT] or f"HTTP {status}"
    if secret:
        message = message.replace(secret, "***")
    return MemstreamAPIError(status, str(code), message)


def advance(op: Op[T], response: Response | None, secret: str) -> Call | Done[T]:
    """Start an operation (``response`` None) or hand it the answer to its last call: the
    one place where the sync and the async client meet the operations."""
    try:
        if response is None:
            return next(op)  # validation happens here, before any request
        if not response.is_success:
            raise api_error(response.status_code, response.content, secret)
        return op.send(response)
    except StopIteration as done:
        return Done(cast(T, done.value))


FAILOVER_STATUSES = frozenset({502, 503, 504})  # the worker asked cannot answer now


def failover(error: Exception) -> bool:
    """Is another worker worth asking after ``error``? Only when the request cannot have
    reached this one (no connection): a read timeout may have been processed."""
    return isinstance(error.__cause__, ConnectError)


@contextlib.contextmanager
def reaching_api() -> Iterator[None]:
    try:
        yield
    except TransportError as exc:
        raise MemstreamConnectionError(
            f"memstream API unreachable: {type(exc).__name__}: {exc}") from exc


def fusion_options(options: Mapping[str, Any], sources: Sources | None,
                   turn_match: TurnMatch | None, recency: bool | None) -> dict[str, Any]:
    """A search's other fields with the fusion's, those given (unset: the server's)."""
    given = {"sources": sources, "turn_match": turn_match, "recency": recency}
    return {**options, **{k: v for k, v in given.items() if v is not None}}


def search_op(tenant: str, user: str, query: str, limit: int | None,
              options: Mapping[str, Any]) -> Op[SearchResponse]:
    body = SearchRequest(query=query, k=limit, **options)
    response = yield Call("POST", user_path(paths.SEARCH, tenant, user), json=_body(body))
    return parse(response, SearchResponse)


def context_op(tenant: str, user: str, request: ContextRequest) -> Op[ContextResponse]:
    response = yield Call("POST", user_path(paths.CONTEXT, tenant, user), json=_body(request))
    return parse(response, ContextResponse)


def get_all_op(tenant: str, user: str, status: str | None, type_: str | None,
               page_size: int) -> Op[list[MemoryOut]]:
    if not 1 <= page_size <= MAX_PAGE:
        raise ValueError(f"page_size must be 1..{MAX_PAGE}")
    path = user_path(paths.MEMORIES, tenant, user)
    params: dict[str, str | int] = {"limit": page_size}
    params |= {k: v for k, v in (("status", status), ("type", type_)) if v is not None}
    memories: list[MemoryOut] = []
    seen: set[str] = set()
    while True:
        page = parse((yield Call("GET", path, params=dict(params))), MemoryPage)
        memories.extend(page.memories)
        if page.next_cursor is None:
            return memories
        if page.next_cursor in seen:  # a server bug must not become an endless loop
            raise MemstreamError(f"the API repeated the cursor {page.next_cursor!r}")
        seen.add(page.next_cursor)
        params["cursor"] = page.next_cursor


def tools_op() -> Op[list[dict[str, Any]]]:
    data = (yield Call("GET", paths.TOOLS)).json()
    tools = data.get("tools") if isinstance(data, dict) else data  # bare list or {"tools": []}
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise MemstreamError("unexpected tool list from the API")
    return tools


def execute_tool_op(tenant: str, user: str, request: ToolCallRequest) -> Op[ToolResult]:
    path = user_path(paths.EXECUTE_TOOL, tenant, user)
    call = Call("POST", path, json=_body(request), min_timeout=request.wait_s + 5.0,
                idempotency_key=new_key())
    return parse((yield call), ToolResult)


def feedback_op(tenant: str, user: str, request: FeedbackRequest) -> Op[Accepted]:
    path = user_path(paths.FEEDBACK, tenant, user)
    call = Call("POST", path, json=_body(request), idempotency_key=new_key())
    return parse((yield call), Accepted)


def context_request(query: str, session_id: str | None, limit: int | None,
                    budget_chars: int | None, budget_tokens: int | None,
                    record_hits: bool = True) -> ContextRequest:
    extra = {} if record_hits else {"record_hits": False}
    return ContextRequest(query=query, session_id=session_id, k=limit,
                          budget_chars=budget_chars, budget_tokens=budget_tokens, **extra)


def tool_call(name: str, arguments: Mapping[str, Any] | str, session_id: str | None,
              tool_call_id: str | None, wait_s: float = 5.0) -> ToolCallRequest:
    args = arguments if isinstance(arguments, str) else dict(arguments)
    extra = {} if wait_s == 5.0 else {"wait_s": wait_s}
    return ToolCallRequest(name=name, arguments=args, session_id=session_id,
                           tool_call_id=tool_call_id, **extra)


# --- the HTTP way in: a client without Kafka settings ------------------------------------
def add_messages_op(tenant: str, user: str, session: str,
                    messages: Sequence[ChatMessage]) -> Op[list[str]]:
    """``add`` over HTTP: the messages (validated, each with its id) in requests of at most
    :data:`HTTP_BATCH` (the ids the ingest stage remembers per session by default, so a
    retried request is dropped whole), each with an ``Idempotency-Key`` of its own;
    returns the ids the worker took them with, in order."""
    taken: list[str] = []
    for start in range(0, len(messages), HTTP_BATCH):
        body = MessagesRequest(session_id=session, messages=[
            MessageIn(role=m.role, content=m.content, message_id=m.message_id, ts=m.ts,
                      metadata=m.metadata) for m in messages[start:start + HTTP_BATCH]])
        call = Call("POST", user_path(paths.MESSAGES, tenant, user), json=_body(body),
                    idempotency_key=new_key())
        accepted = parse((yield call), MessagesAccepted)
        taken += [m.message_id for m in accepted.messages]
    return taken


def end_session_op(tenant: str, user: str, session: str) -> Op[SessionEndAccepted]:
    path = user_path(paths.SESSION_END, tenant, user, session_id=check_id("session_id", session))
    return parse((yield Call("POST", path, idempotency_key=new_key())), SessionEndAccepted)
