"""The request checks and answers every route of the HTTP API is built from: key, scope,
path ids, bounded JSON bodies, list parameters, and the JSON answer.

A scoped route checks, in this order: key (401; a failing one past the failed-login limit
429; a valid one past its request rate 429), path ids (400), tenant (403), readiness (503),
then reads the body (413 / 400). The body is never read for
a caller without a key. A request another worker forwarded (its credential verified by
:mod:`memstream.web.forwarding`) carries its caller's principal instead of a key.
The ``Content-Type`` is not checked: a body that parses as a JSON object is accepted (curl's
default form type and a missing header are common mistakes that cost nothing to forgive).
Keys are handed to the :class:`~memstream.web.http_base.Authoriser` and nowhere else: not
logged, not echoed.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from memstream.contract.http_api.api import MAX_PAGE, ErrorCode, Principal
from memstream.topics.schemas import ID_PATTERN
from memstream.web.http_base import (
    DEFAULT_PAGE,
    DEPS,
    IDEMPOTENCY_KEY,
    LIMIT_RE,
    LIST_STATUSES,
    LIST_TYPES,
    MAX_CURSOR_CHARS,
    MAX_KEY_CHARS,
    MAX_MESSAGE_CHARS,
    ApiError,
    Backend,
    Handler,
    key_prefix,
)

B = TypeVar("B", bound=BaseModel)


def bound(text: str) -> str:
    """``text`` cut to the length of an error message."""
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def bad(message: str) -> ApiError:
    return ApiError(400, ErrorCode.BAD_REQUEST, message)


def ok(model: BaseModel, status: int = 200) -> web.Response:
    """The model as the JSON body, encoded by pydantic-core in one pass (UTF-8, compact)
    rather than dumped to Python objects and encoded again."""
    return web.Response(body=model.__pydantic_serializer__.to_json(model), status=status,
                        content_type="application/json", charset="utf-8")


# --- key and scope ---------------------------------------------------------------------
def presented_key(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("X-API-Key", "").strip()


PRINCIPAL = web.RequestKey("memstream_principal", Principal)  # whom it is for, once known
FORWARDED_BY = web.RequestKey("memstream_forwarded_by", str)  # the worker that signed it


def well_formed(key: str) -> bool:
    """Could ``key`` be a credential at all: 1 to MAX_KEY_CHARS printable ASCII characters
    (a key, the metrics key, the admin key). Anything else (non-ASCII text, bytes that are
    not UTF-8, control characters) is a malformed credential: 401, never looked up."""
    return 0 < len(key) <= MAX_KEY_CHARS and key.isascii() and key.isprintable()


def check_key(request: web.Request, key: str,
              accept: Callable[[str], Principal | None]) -> Principal:
    """``accept(key)``, the key checked first: a valid key always opens, whatever failed
    before from its address or under its key id (one NAT, or a key id, which is no secret,
    cannot lock anyone out), under its key's request rate (429 to that key only). A key
    that fails is 401 (counted), or 429 once its address or its prefix (its key id) failed
    too often this minute. A missing key is 401, not counted; a malformed one 401,
    counted."""
    guard = request.app[DEPS].guard
    principal = accept(key) if well_formed(key) else None
    if principal is not None:
        wait = guard.request_wait(principal.key_id)
        if wait is None:
            return principal
        raise ApiError(429, ErrorCode.RATE_LIMITED, "too many requests with this key; "
                       "retry later", {"Retry-After": str(max(1, math.ceil(wait)))})
    if not key:  # a missing key guesses nothing: not counted
        raise ApiError(401, ErrorCode.UNAUTHORIZED, "missing or unknown API key")
    who = (f"addr:{request.remote or '?'}", f"key:{key_prefix(key)}")
    wait = guard.retry_after(*who)
    if wait is None:
        guard.failed(*who)
        raise ApiError(401, ErrorCode.UNAUTHORIZED, "missing or unknown API key")
    raise ApiError(429, ErrorCode.RATE_LIMITED, "too many failed key checks; retry later",
                   {"Retry-After": str(math.ceil(wait))})


def authenticate(request: web.Request) -> Principal:
    """The caller's principal: the one a verified forward names, else its key's."""
    principal = request.get(PRINCIPAL)
    if principal is None:
        principal = check_key(request, presented_key(request),
                              request.app[DEPS].authoriser.authorise)
        request[PRINCIPAL] = principal
    return principal


def identified(request: web.Request, *names: str) -> tuple[Principal, list[str]]:
    """Key, path ids (the first one the tenant) and tenant: what the worker a request
    arrives at checks before it forwards it anywhere."""
    principal = authenticate(request)
    values = [request.match_info[name] for name in names]
    for label, value in zip(names, values, strict=True):
        if not ID_PATTERN.fullmatch(value):
            raise bad(f"invalid {label} id: 1-128 of letters, digits and . _ : @ + = -")
    if not principal.may_open(values[0]):
        raise ApiError(403, ErrorCode.FORBIDDEN, "this key does not open this tenant")
    return principal, values


def scoped(request: web.Request, *names: str) -> tuple[Principal, list[str]]:
    """Key, path ids, tenant (:func:`identified`), readiness: everything checked before a
    body is read."""
    principal, values = identified(request, *names)
    backend = request.app[DEPS].backend
    if not backend.ready():
        raise ApiError(503, ErrorCode.UNAVAILABLE, "starting, retry later")
    if len(values) > 1 and not backend.serving(values[0], values[1]):
        raise ApiError(503, ErrorCode.UNAVAILABLE, "this user's partition is being restored "
                       "here, retry later")
    return principal, values


def scope(request: web.Request) -> tuple[str, str, Principal]:
    principal, (tenant, user) = scoped(request, "tenant", "user")
    return tenant, user, principal


# --- idempotency keys ------------------------------------------------------------------
IDEMPOTENCY = web.RequestKey("memstream_idempotency_key", str)  # a write's: given or made


def idempotency_key(given: str | None) -> str:
    """The key a write is taken once by: the caller's (checked), else a new one."""
    if given is None:
        return uuid.uuid4().hex
    if len(given) > 128 or not ID_PATTERN.fullmatch(given):
        raise bad(f"{IDEMPOTENCY_KEY}: 1-128 of letters, digits and . _ : @ + = -")
    return given


# --- bodies and parameters -------------------------------------------------------------
BODY_READ = web.RequestKey("memstream_body", bytes)  # the whole body, once read


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body (chunked too), read once and kept; 413 past ``limit`` bytes: never a
    part of it."""
    if BODY_READ in request:
        return request[BODY_READ]
    too_large = ApiError(413, ErrorCode.PAYLOAD_TOO_LARGE, f"body larger than {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    data = bytearray()
    while chunk := await request.content.readany():
        data += chunk
        if len(data) > limit:
            raise too_large
    request[BODY_READ] = bytes(data)
    return request[BODY_READ]


async def read_object(request: web.Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, read at most ``limit`` bytes far (chunked bodies too)."""
    data = await read_body(request, limit)
    try:
        obj = json.loads(data, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise bad(f"body is not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError):  # bad UTF-8, NaN / Infinity, absurd nesting
        raise bad("body is not valid JSON") from None
    if not isinstance(obj, dict):
        raise bad("body must be a JSON object")
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def validation_message(exc: ValidationError) -> str:
    """Names the fields and what is wrong with them, never the values sent."""
    parts = [f"{'.'.join(str(p)[:40] for p in e['loc']) or 'body'}: {e['msg']}"
             for e in exc.errors(include_url=False, include_input=False, include_context=False)]
    return bound("invalid body: " + "; ".join(parts))


def list_params(query: Mapping[str, str]) -> dict[str, Any]:
    raw = query.get("limit", str(DEFAULT_PAGE))
    if not LIMIT_RE.fullmatch(raw) or not 1 <= int(raw) <= MAX_PAGE:
        raise bad(f"limit must be an integer from 1 to {MAX_PAGE}")
    cursor = query.get("cursor") or None
    if cursor is not None and len(cursor) > MAX_CURSOR_CHARS:
        raise bad(f"cursor longer than {MAX_CURSOR_CHARS} characters")
    status, type_ = query.get("status") or None, query.get("type") or None
    if status is not None and status not in LIST_STATUSES:
        raise bad(f"status must be one of {', '.join(LIST_STATUSES)}")
    if type_ is not None and type_ not in LIST_TYPES:
        raise bad(f"type must be one of {', '.join(LIST_TYPES)}")
    return {"limit": int(raw), "cursor": cursor, "status": status, "type": type_}


Call = Callable[[Backend, str, str, B, Principal, str | None], Awaitable[BaseModel]]


def post(model: type[B], call: Call[B]) -> Handler:
    """One handler shape for every POST: scope, body into ``model``, backend call (with
    the write's idempotency key, None for a read)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        tenant, user, principal = scope(request)
        deps = request.app[DEPS]
        obj = await read_object(request, deps.max_body_bytes)
        try:
            body = model.model_validate(obj)
        except ValidationError as exc:
            raise bad(validation_message(exc)) from None
        return ok(await call(deps.backend, tenant, user, body, principal,
                             request.get(IDEMPOTENCY)))

    return handle
