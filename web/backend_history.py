"""History, lineage and corrections for the HTTP API (the worker's side).

Reads come from the store's version records (every version is kept until a forget-me
erases it) and the session-window table; corrections (delete, rollback, undo a job) are
sent to the tool-requests topic as writes of their own kind and become jobs of the user
(:mod:`memory.governance` decides them), so they are serialised with the user's other
jobs, fenced, published as change events and rebuilt by a replay like every change.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from memstream.contract.http_api.api import ErrorCode, Principal, WindowMessage
from memstream.contract.http_api.history import (
    ChangePage,
    CorrectionRequest,
    CorrectionResult,
    HistoryResponse,
    SourceResponse,
    VersionOut,
)
from memstream.memory import retrieval
from memstream.memory.coalescing import tool_job_id
from memstream.memory.model import Memory
from memstream.memory.store import Scope
from memstream.streams import privacy, window
from memstream.streams.pipeline import Pipeline
from memstream.streams.waiters import Outcome
from memstream.topics.schemas import ToolRequest, ToolWrite
from memstream.web.http_base import ApiError

MAX_VERSIONS = 50_000  # version records of one user a history call reads
KEYS_READY_S = 30.0

Send = Callable[[ToolRequest], Awaitable[None]]


def _kind(m: Memory) -> str:
    return str(m.extra.get("lineage_kind") or "")


def version_out(m: Memory) -> VersionOut:
    s = m.source
    return VersionOut.model_validate({
        **retrieval.memory_dict(m),
        "lineage": {"kind": _kind(m), "job_id": s.job_id, "op_id": s.op_id,
                    "session_id": s.session_id, "from_seq": s.from_seq, "to_seq": s.to_seq,
                    "message_ids": list(s.message_ids), "reason": str(m.extra.get("reason", "")),
                    "trigger": str(m.extra.get("trigger", "")),
                    "closed_by_job": m.extra.get("closed_job")}})


def _versions(p: Pipeline, tenant: str, user: str) -> list[Memory]:
    found = p.services.store.list(Scope(tenant, user), statuses=None, limit=MAX_VERSIONS)
    mine = [m for m in found if (m.tenant_id, m.user_id) == (tenant, user)]  # not global
    return privacy.visible(p, tenant, user, mine)


async def history(p: Pipeline, tenant: str, user: str, memory_id: str) -> HistoryResponse:
    mine = await asyncio.to_thread(_versions, p, tenant, user)
    versions = sorted((m for m in mine if m.memory_id == memory_id), key=lambda m: m.version)
    if not versions:
        raise ApiError(404, ErrorCode.NOT_FOUND, "no memory with this id for this user")
    return HistoryResponse(memory_id=memory_id, versions=[version_out(m) for m in versions])


async def source(p: Pipeline, tenant: str, user: str, memory_id: str,
                 version: int | None) -> SourceResponse:
    """"Which conversation did this come from?": the version's message range, and those
    of its messages the session window still holds."""
    found = await history(p, tenant, user, memory_id)
    chosen = found.versions[-1] if version is None else next(
        (v for v in found.versions if v.version == version), None)
    if chosen is None:
        raise ApiError(404, ErrorCode.NOT_FOUND, "no such version of this memory")
    lin = chosen.lineage
    rows = window.rows(p.window, tenant, user, lin.session_id, window.keep(p.settings))
    wanted = set(lin.message_ids)
    kept = [WindowMessage(seq=r[0], message_id=r[1], role=r[2], content=r[3], ts=r[4])
            for r in rows if r[1] in wanted or lin.from_seq <= r[0] < lin.to_seq]
    return SourceResponse(
        memory_id=memory_id, version=chosen.version, session_id=lin.session_id,
        from_seq=lin.from_seq, to_seq=lin.to_seq, message_ids=lin.message_ids, messages=kept,
        retained=bool(wanted) and wanted <= {m.message_id for m in kept})


async def changes(p: Pipeline, tenant: str, user: str, offset: int, limit: int,
                  token: Callable[[int], str]) -> ChangePage:
    """Every version record of the user, newest change first (closing counts as one)."""
    mine = await asyncio.to_thread(_versions, p, tenant, user)
    mine.sort(key=lambda m: (-(m.valid_to or m.valid_from), m.memory_id, -m.version))
    page = mine[offset:offset + limit]
    more = len(mine) > offset + limit
    return ChangePage(changes=[version_out(m) for m in page],
                      next_cursor=token(offset + limit) if more else None)


def _request_id(tenant: str, user: str, write: ToolWrite, now: float,
                idempotency_key: str | None = None) -> str:
    """A correction is taken once per request: its ``Idempotency-Key`` (else its time) is
    part of its id, and the ingest stage drops a request id it has seen
    (``memory.coalescing.on_tool``), so a retry with the same key is not applied again."""
    once = f"key:{idempotency_key}" if idempotency_key else f"{now:.6f}"
    raw = "\x1f".join([tenant, user, write.model_dump_json(), once])
    return "corr-" + hashlib.sha256(raw.encode()).hexdigest()[:32]


async def correct(p: Pipeline, send: Send, tenant: str, user: str, write: ToolWrite,
                  req: CorrectionRequest, principal: Principal,
                  idempotency_key: str | None = None) -> CorrectionResult:
    """Send one correction as a job of the user and wait (``wait_s``) for its outcome."""
    now = p.clock()
    write = write.model_copy(update={"reason": req.reason, "principal": principal.key_id})
    request_id = _request_id(tenant, user, write, now, idempotency_key)
    job_id = tool_job_id(tenant, user, request_id)
    future = p.waiters.expect(job_id)
    request = ToolRequest(request_id=request_id, tenant_id=tenant, user_id=user, write=write,
                          principal=principal.key_id, ts=datetime.fromtimestamp(now, UTC))
    try:
        await send(request)
    except BaseException:
        p.waiters.resolve(job_id, Outcome("failed", error="not sent"))
        raise
    outcome = await p.waiters.wait(job_id, future, req.wait_s)
    if outcome is None:
        return CorrectionResult(status="queued", job_id=job_id)
    if write.name == "delete":
        p.counters.user_deletions += sum(c["op"] == "delete" for c in outcome.changes)
    failed = outcome.status == "failed" or (outcome.error and not outcome.changes)
    return CorrectionResult.model_validate({
        "status": "failed" if failed else "done", "job_id": job_id,
        "changes": outcome.changes, "error": outcome.error})


def write_for(name: str, **fields: Any) -> ToolWrite:
    return ToolWrite.model_validate({"name": name, **fields})


async def forget(p: Pipeline, send: Send, tenant: str, user: str, req: CorrectionRequest,
                 principal: Principal, idempotency_key: str | None = None) -> CorrectionResult:
    """Forget-me: shred the user's data keys and fence their memories (at once), then
    erase them everywhere as a job of the user (see :mod:`memstream.streams.privacy`)."""
    now = p.clock()
    if p.user_keys is not None:
        if not await p.user_keys.wait_ready(KEYS_READY_S):  # shred every key it has
            raise ApiError(503, ErrorCode.UNAVAILABLE, "user keys not loaded yet, retry")
        await p.user_keys.forget(tenant, user, now, "api", principal.key_id)
    p.counters.forget_requests += 1
    return await correct(p, send, tenant, user, write_for("forget"), req, principal,
                         idempotency_key)
