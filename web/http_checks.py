"""The request checks and answers every route of the HTTP API is built from: key, scope,
path ids, bounded JSON bodies, list parameters, and the JSON answer.

A scoped route checks, in this order: key (401), path ids (400), tenant (403), readiness
(503), then reads the body (413 / 400). The body is never read for a caller without a key.
The ``Content-Type`` is not checked: a body that parses as a JSON object is accepted (curl's
default form type and a missing header are common mistakes that cost nothing to forgive).
Keys are handed to the :class:`~memstream.web.http_base.Authoriser` and nowhere else: not
logged, not echoed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from memstream.topics.schemas import ID_PATTERN
from memstream.web.http_base import (
    DEFAULT_PAGE,
    DEPS,
    LIMIT_RE,
    LIST_STATUSES,
    LIST_TYPES,
    MAX_CURSOR_CHARS,
    MAX_KEY_CHARS,
    MAX_MESSAGE_CHARS,
    ApiError,
    Backend,
    Handler,
)
from memstream.web.models.api import MAX_PAGE, ErrorCode, Principal

B = TypeVar("B", bound=BaseModel)


def bound(text: str) -> str:
    """``text`` cut to the length of an error message."""
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def bad(message: str) -> ApiError:
    return ApiError(400, ErrorCode.BAD_REQUEST, message)


def ok(model: BaseModel, status: int = 200) -> web.Response:
    return web.json_response(model.model_dump(mode="json"), status=status)


# --- key and scope ---------------------------------------------------------------------
def presented_key(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("X-API-Key", "").strip()


def authenticate(request: web.Request) -> Principal:
    key = presented_key(request)
    valid = bool(key) and len(key) <= MAX_KEY_CHARS
    principal = request.app[DEPS].authoriser.authorise(key) if valid else None
    if principal is None:
        raise ApiError(401, ErrorCode.UNAUTHORIZED, "missing or unknown API key")
    return principal


def scoped(request: web.Request, *names: str) -> tuple[Principal, list[str]]:
    """Key, path ids (the first one the tenant), tenant, readiness: everything checked
    before a body is read."""
    principal = authenticate(request)
    values = [request.match_info[name] for name in names]
    for label, value in zip(names, values, strict=True):
        if not ID_PATTERN.fullmatch(value):
            raise bad(f"invalid {label} id: 1-128 of letters, digits and . _ : @ + = -")
    if not principal.may_open(values[0]):
        raise ApiError(403, ErrorCode.FORBIDDEN, "this key does not open this tenant")
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


# --- bodies and parameters -------------------------------------------------------------
BODY_READ = "memstream_body"  # a body web.routing read to forward, kept for the handler


async def read_object(request: web.Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, read at most ``limit`` bytes far (chunked bodies too)."""
    too_large = ApiError(413, ErrorCode.PAYLOAD_TOO_LARGE, f"body larger than {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    data = bytearray(request.get(BODY_READ, b""))  # read already (a failed forward)
    while chunk := await request.content.readany():
        data += chunk
        if len(data) > limit:
            raise too_large
    try:
        obj = json.loads(bytes(data), parse_constant=_no_constant)
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


def post(model: type[B],
         call: Callable[[Backend, str, str, B, Principal], Awaitable[BaseModel]]) -> Handler:
    """One handler shape for every POST: scope, body into ``model``, backend call."""

    async def handle(request: web.Request) -> web.StreamResponse:
        tenant, user, principal = scope(request)
        deps = request.app[DEPS]
        obj = await read_object(request, deps.max_body_bytes)
        try:
            body = model.model_validate(obj)
        except ValidationError as exc:
            raise bad(validation_message(exc)) from None
        return ok(await call(deps.backend, tenant, user, body, principal))

    return handle
