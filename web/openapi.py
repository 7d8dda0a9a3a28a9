"""The OpenAPI 3.1 document of the worker's HTTP API, built from its route table.

Everything here is derived from the route table it is given (the server passes
:data:`memstream.web.http.ROUTES`) and the pydantic contract models of
:mod:`memstream.contract.http_api.api`, so the served app and its document cannot drift apart.
Pure: no aiohttp app is built, nothing is served from here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from memstream.contract.http_api.api import MAX_PAGE, ErrorBody, ErrorCode
from memstream.topics.schemas import ID_PATTERN
from memstream.web.http_base import (
    DEFAULT_PAGE,
    HTTP_CODES,
    IDEMPOTENCY_KEY,
    LIST_STATUSES,
    LIST_TYPES,
    MAX_CURSOR_CHARS,
    PageRoute,
    Route,
)
from memstream.web.http_ingest import AcceptedRoute

REF = "#/components/schemas/{model}"

_PATH_PARAMS = [{"name": n, "in": "path", "required": True,
                 "schema": {"type": "string", "pattern": ID_PATTERN.pattern}}
                for n in ("tenant", "user")]
_LIST_QUERY = [
    {"name": "limit", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE}},
    {"name": "cursor", "in": "query", "required": False,
     "schema": {"type": "string", "maxLength": MAX_CURSOR_CHARS}},
    {"name": "status", "in": "query", "required": False,
     "schema": {"type": "string", "enum": list(LIST_STATUSES)}},
    {"name": "type", "in": "query", "required": False,
     "schema": {"type": "string", "enum": list(LIST_TYPES)}},
]


_IDEMPOTENCY = {
    "name": IDEMPOTENCY_KEY, "in": "header", "required": False,
    "description": "This write is taken once per key: retry with the same one. Without it the "
    "worker makes one and answers with it (the response header of the same name).",
    "schema": {"type": "string", "pattern": ID_PATTERN.pattern, "maxLength": 128}}


def error_statuses(route: Route) -> list[int]:
    """The error statuses a route can answer with (404/405 for unknown paths aside)."""
    found = {500}
    if route.keyed:
        found |= {401, 429, 503}
    if route.write:
        found.add(400)
    if "{tenant}" in route.path:
        found |= {400, 403}
    if "{memory_id}" in route.path:
        found.add(404)
    if route.body is not None:
        found |= {400, 413}
    return sorted(found)


def success_status(route: Route) -> int:
    """The status of a route's answer when it succeeds (202: taken, not yet processed)."""
    return route.status if isinstance(route, AcceptedRoute) else 200


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _operation(r: Route, refs: Mapping[Any, dict[str, Any]]) -> dict[str, Any]:
    out = refs[(r.out, "serialization")] if r.out is not None else {"type": "object"}
    status = success_status(r)
    ok = _json(out, "Accepted" if status == 202 else "OK")
    if isinstance(r, PageRoute):  # the inspector's files: text, not JSON
        ok = {"description": "OK", "content": {r.media_type: {"schema": {"type": "string"}}}}
    op: dict[str, Any] = {"operationId": r.name, "summary": r.summary,
                          "responses": {str(status): ok}}
    if "{tenant}" in r.path:
        extra = [{**_PATH_PARAMS[0], "name": n} for n in ("memory_id", "job_id", "session_id")
                 if f"{{{n}}}" in r.path]
        query = _LIST_QUERY if r.name == "list_memories" else (
            _LIST_QUERY[:2] if r.name in ("change_log", "tenant_audit") else [])
        path = [p for p in _PATH_PARAMS if f"{{{p['name']}}}" in r.path]
        op["parameters"] = path + extra + query
    if r.write:
        op["parameters"] = [*op.get("parameters", []), _IDEMPOTENCY]
        ok["headers"] = {IDEMPOTENCY_KEY: {"description": "The key this write was taken by",
                                           "schema": {"type": "string"}}}
    if r.body is not None:
        op["requestBody"] = {"required": r.body_required, "content": {
            "application/json": {"schema": refs[(r.body, "validation")]}}}
    if not r.keyed:
        op["security"] = []
    error = refs[(ErrorBody, "serialization")]
    for status in error_statuses(r):
        code = HTTP_CODES.get(status, ErrorCode.INTERNAL)
        op["responses"][str(status)] = _json(error, code.value)
    if "429" in op["responses"]:
        op["responses"]["429"]["headers"] = {"Retry-After": {
            "description": "Seconds until a key may be tried again", "schema": {
                "type": "integer"}}}
    if r.name == "health":  # the only 503 that is not an ErrorBody
        op["responses"]["503"] = _json(out, "starting")
    return op


def openapi_document(routes: Iterable[Route]) -> dict[str, Any]:
    """OpenAPI 3.1 for ``routes`` (the server's :data:`~memstream.web.http.ROUTES`);
    schemas come from the pydantic contract models."""
    routes = tuple(routes)
    wanted: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (r.body, "validation") for r in routes if r.body is not None]
    wanted += [(r.out, "serialization") for r in routes if r.out is not None]
    wanted.append((ErrorBody, "serialization"))
    refs, defs = models_json_schema(list(dict.fromkeys(wanted)), ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r, refs)
    return copy.deepcopy({  # callers may edit their copy; the module's constants stay put
        "openapi": "3.1.0",
        "info": {"title": "memstream", "version": "1",
                 "description": "Long-term memory for LLM agents, scoped per tenant and user."},
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "apiKey": {"type": "apiKey", "in": "header",
                                           "name": "X-API-Key"}},
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    })
