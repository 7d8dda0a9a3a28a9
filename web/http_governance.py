"""The HTTP routes of history, corrections, forget-me and the audit log (SPEC §4, §7):
their handlers, on the checks of :mod:`memstream.web.http_checks` (key, scope, ids,
bodies), and their entries of the route table."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import ErrorCode
from memstream.contract.http_api.history import (
    AuditPage,
    ChangePage,
    CorrectionRequest,
    CorrectionResult,
    HistoryResponse,
    Residue,
    RollbackRequest,
    SourceResponse,
)
from memstream.topics.schemas import ID_PATTERN, ToolWrite
from memstream.web.http_base import DEPS, LIMIT_RE, ApiError, Handler, Route
from memstream.web.http_checks import (
    IDEMPOTENCY,
    bad,
    list_params,
    ok,
    post,
    read_object,
    scope,
    scoped,
    validation_message,
)


def _path_id(request: web.Request, name: str) -> str:
    value = request.match_info[name]
    if not ID_PATTERN.fullmatch(value):
        raise bad(f"invalid {name}: 1-128 of letters, digits and . _ : @ + = -")
    return value


async def _history(request: web.Request) -> web.StreamResponse:
    tenant, user, _ = scope(request)
    memory_id = _path_id(request, "memory_id")
    return ok(await request.app[DEPS].backend.history(tenant, user, memory_id))


async def _source(request: web.Request) -> web.StreamResponse:
    tenant, user, _ = scope(request)
    memory_id = _path_id(request, "memory_id")
    raw = request.query.get("version")
    if raw is not None and not LIMIT_RE.fullmatch(raw):
        raise bad("version must be a positive integer")
    version = int(raw) if raw is not None else None
    return ok(await request.app[DEPS].backend.source(tenant, user, memory_id, version))


async def _audit(request: web.Request) -> web.StreamResponse:
    _, (tenant,) = scoped(request, "tenant")
    params = list_params(request.query)
    user, kind = request.query.get("user") or None, request.query.get("kind") or None
    if user is not None and not ID_PATTERN.fullmatch(user):
        raise bad("invalid user id")
    if kind is not None and not re.fullmatch(r"[a-z_]{1,32}", kind):
        raise bad("invalid kind")
    return ok(await request.app[DEPS].backend.audit(
        tenant, limit=params["limit"], cursor=params["cursor"], user=user, kind=kind))


async def _residue(request: web.Request) -> web.StreamResponse:
    tenant, user, principal = scope(request)
    if not principal.admin:
        raise ApiError(403, ErrorCode.FORBIDDEN, "operators only (the admin key)")
    return ok(await request.app[DEPS].backend.residue(tenant, user))


async def _changes(request: web.Request) -> web.StreamResponse:
    tenant, user, _ = scope(request)
    params = list_params(request.query)
    return ok(await request.app[DEPS].backend.changes(
        tenant, user, limit=params["limit"], cursor=params["cursor"]))


def _correction(model: type[CorrectionRequest], name: str, id_name: str | None,
                **fixed: Any) -> Handler:
    """A correction: scope, the path id, an optional body, a write of its own kind."""

    async def handle(request: web.Request) -> web.StreamResponse:
        tenant, user, principal = scope(request)
        target = _path_id(request, id_name) if id_name else ""
        deps = request.app[DEPS]
        has_body = request.content_length or request.headers.get("Transfer-Encoding")
        obj = await read_object(request, deps.max_body_bytes) if has_body else {}
        try:
            body = model.model_validate(obj)
        except ValidationError as exc:
            raise bad(validation_message(exc)) from None
        write = ToolWrite.model_validate({
            "name": name, "target_id": target,
            "version": getattr(body, "version", 0), **fixed})
        return ok(await deps.backend.correct(tenant, user, write, body, principal,
                                             request.get(IDEMPOTENCY)))

    return handle


GOVERNANCE_ROUTES: tuple[Route, ...] = (
    Route("GET", paths.MEMORY_HISTORY, "memory_history",
          "Every version of a memory with its lineage", _history, HistoryResponse),
    Route("GET", paths.MEMORY_SOURCE, "memory_source",
          "The messages a version came from, while the session window keeps them",
          _source, SourceResponse),
    Route("GET", paths.CHANGES, "change_log", "The user's change log, newest first",
          _changes, ChangePage),
    Route("DELETE", paths.MEMORY, "delete_memory",
          "Delete one memory (soft: no longer retrievable; audited)",
          _correction(CorrectionRequest, "delete", "memory_id"), CorrectionResult,
          CorrectionRequest, body_required=False, write=True),
    Route("DELETE", paths.MEMORIES, "delete_memories", "Delete every memory of the user",
          _correction(CorrectionRequest, "delete", None, all_memories=True), CorrectionResult,
          CorrectionRequest, body_required=False, write=True),
    Route("POST", paths.MEMORY_ROLLBACK, "rollback_memory",
          "A new version equal to an earlier one (restores a deleted memory)",
          _correction(RollbackRequest, "rollback", "memory_id"), CorrectionResult,
          RollbackRequest, write=True),
    Route("POST", paths.FORGET, "forget_user",
          "Forget-me: hide every memory of the user at once, then erase the user's content "
          "everywhere memstream keeps it (see README: the erasure bound)",
          post(CorrectionRequest, lambda b, t, u, r, p, k: b.forget(t, u, r, p, k)),
          CorrectionResult, CorrectionRequest, write=True),
    Route("GET", paths.AUDIT, "tenant_audit",
          "The tenant's audit log, newest first: who did what, when (no content)",
          _audit, AuditPage),
    Route("GET", paths.RESIDUE, "user_residue",
          "Operators: how many records of the user the store holds (forget-me verification)",
          _residue, Residue),
    Route("POST", paths.UNDO_JOB, "undo_job",
          "Undo every change of one job", _correction(CorrectionRequest, "undo_job", "job_id"),
          CorrectionResult, CorrectionRequest, body_required=False, write=True),
)
