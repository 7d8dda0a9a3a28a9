"""The client's history and correction operations (sans-I/O, like :mod:`._ops`)."""

from __future__ import annotations

from memstream.client._ops import Call, Op, check_id, new_key, parse, user_path
from memstream.contract.exceptions import MemstreamError
from memstream.contract.http_api import paths
from memstream.contract.http_api.api import MAX_PAGE
from memstream.contract.http_api.history import (
    AuditEntry,
    AuditPage,
    ChangePage,
    CorrectionRequest,
    CorrectionResult,
    HistoryResponse,
    RollbackRequest,
    SourceResponse,
    VersionOut,
)


def history_op(tenant: str, user: str, memory_id: str) -> Op[HistoryResponse]:
    memory_id = check_id("memory_id", memory_id)
    path = user_path(paths.MEMORY_HISTORY, tenant, user, memory_id=memory_id)
    return parse((yield Call("GET", path)), HistoryResponse)


def source_op(tenant: str, user: str, memory_id: str,
              version: int | None) -> Op[SourceResponse]:
    memory_id = check_id("memory_id", memory_id)
    path = user_path(paths.MEMORY_SOURCE, tenant, user, memory_id=memory_id)
    params: dict[str, str | int] | None = None if version is None else {"version": version}
    return parse((yield Call("GET", path, params=params)), SourceResponse)


def changes_op(tenant: str, user: str, limit: int | None) -> Op[list[VersionOut]]:
    """The user's change log, newest first (every page, or the first ``limit`` rows)."""
    path = user_path(paths.CHANGES, tenant, user)
    params: dict[str, str | int] = {"limit": min(limit or MAX_PAGE, MAX_PAGE)}
    out: list[VersionOut] = []
    seen: set[str] = set()
    while True:
        page = parse((yield Call("GET", path, params=dict(params))), ChangePage)
        out.extend(page.changes)
        if page.next_cursor is None or (limit is not None and len(out) >= limit):
            return out[:limit] if limit is not None else out
        if page.next_cursor in seen:
            raise MemstreamError(f"the API repeated the cursor {page.next_cursor!r}")
        seen.add(page.next_cursor)
        params["cursor"] = page.next_cursor


def _correction(method: str, path: str, body: CorrectionRequest) -> Op[CorrectionResult]:
    call = Call(method, path, json=body.model_dump(mode="json", exclude_defaults=False),
                min_timeout=body.wait_s + 5.0, idempotency_key=new_key())
    return parse((yield call), CorrectionResult)


def delete_op(tenant: str, user: str, memory_id: str | None, reason: str,
              wait_s: float) -> Op[CorrectionResult]:
    """One memory, or (``memory_id`` None) every memory of the user."""
    ids = {} if memory_id is None else {"memory_id": check_id("memory_id", memory_id)}
    body = CorrectionRequest(reason=reason, wait_s=wait_s)
    route = paths.MEMORIES if memory_id is None else paths.MEMORY
    return _correction("DELETE", user_path(route, tenant, user, **ids), body)


def rollback_op(tenant: str, user: str, memory_id: str, version: int, reason: str,
                wait_s: float) -> Op[CorrectionResult]:
    memory_id = check_id("memory_id", memory_id)
    body = RollbackRequest(version=version, reason=reason, wait_s=wait_s)
    path = user_path(paths.MEMORY_ROLLBACK, tenant, user, memory_id=memory_id)
    return _correction("POST", path, body)


def undo_job_op(tenant: str, user: str, job_id: str, reason: str,
                wait_s: float) -> Op[CorrectionResult]:
    job_id = check_id("job_id", job_id)
    body = CorrectionRequest(reason=reason, wait_s=wait_s)
    return _correction("POST", user_path(paths.UNDO_JOB, tenant, user, job_id=job_id), body)


def forget_op(tenant: str, user: str, reason: str, wait_s: float) -> Op[CorrectionResult]:
    body = CorrectionRequest(reason=reason, wait_s=wait_s)
    return _correction("POST", user_path(paths.FORGET, tenant, user), body)


def audit_op(tenant: str, user: str | None, kind: str | None,
             limit: int) -> Op[list[AuditEntry]]:
    """The tenant's audit log, newest first (the first ``limit`` entries)."""
    params: dict[str, str | int] = {"limit": min(limit, MAX_PAGE)}
    params |= {k: v for k, v in (("user", user), ("kind", kind)) if v is not None}
    path = paths.fill(paths.AUDIT, tenant=check_id("tenant_id", tenant))
    out: list[AuditEntry] = []
    while True:
        page = parse((yield Call("GET", path, params=dict(params))), AuditPage)
        out.extend(page.entries)
        if page.next_cursor is None or len(out) >= limit:
            return out[:limit]
        params["cursor"] = page.next_cursor
