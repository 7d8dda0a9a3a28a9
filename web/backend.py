"""The worker's side of the HTTP API: the :class:`~memstream.web.http_base.Backend` that
answers from the store, the window table and the pipeline, and its start / stop.

Reads run in a worker thread against the store the stages write (the embedded store
lives in this process); they never wait on Kafka: hits go to the
:class:`~memstream.streams.access.AccessRecorder` queue. Tool writes are sent to the
tool-requests topic and become jobs of the user (see :mod:`memory.toolwrite`); the call
waits (``wait_s``) for the apply stage to report the job's changes. The reads are
:class:`~memstream.web.backend_reads.ReadBackend`'s, which this backend extends.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from memstream.contract.http_api.api import (
    ErrorCode,
    Principal,
    ToolCallRequest,
    ToolResult,
)
from memstream.contract.http_api.history import (
    AuditPage,
    ChangePage,
    CorrectionRequest,
    CorrectionResult,
    HistoryResponse,
    Residue,
    SourceResponse,
)
from memstream.contract.http_api.intake import (
    MessagesAccepted,
    MessagesRequest,
    SessionEndAccepted,
    SessionEndRequest,
)
from memstream.memory import retrieval, short_term
from memstream.memory.coalescing import tool_job_id
from memstream.memory.prompt_block import stale_mark
from memstream.memory.store import Scope, held_records
from memstream.memory.tools import ToolError, parse_arguments, replace_core
from memstream.streams import privacy, window
from memstream.streams.access import AccessRecorder
from memstream.streams.pipeline import Pipeline
from memstream.streams.waiters import Outcome
from memstream.topics.schemas import ID_PATTERN, ToolRequest, ToolWrite
from memstream.web import backend_history as history
from memstream.web import backend_ingest as ingest
from memstream.web.backend_reads import (
    ReadBackend,
    page_offset,
    page_token,
    window_out,
)
from memstream.web.http_base import ApiError

log = logging.getLogger(__name__)


def _request_id(tool_call_id: str | None, write: ToolWrite,
                idempotency_key: str | None = None) -> str:
    """The request's id: the model's tool call id (else the request's ``Idempotency-Key``)
    *and* what it asks, so a retried call is taken once (the ingest stage drops a request id
    it has seen: ``memory.coalescing.on_tool``) while a framework reusing ids ("call_0")
    for different writes loses none."""
    what = write.model_dump_json(exclude={"request_id", "call_id", "principal"})
    raw = f"{tool_call_id or idempotency_key or uuid.uuid4().hex}\x1f{what}"
    return "tc-" + hashlib.sha256(raw.encode()).hexdigest()[:40]


class WorkerBackend(ReadBackend):
    """Answers the API from this worker's store and tables: the reads of
    :class:`ReadBackend`, the agent tools, history and corrections."""

    def __init__(self, p: Pipeline, recorder: AccessRecorder) -> None:
        super().__init__(p, recorder)
        self.audit_log: Any = None  # memstream.web.audit.AuditLog, started by web.serve
        self.ingest = ingest.IngestProducer(p.settings)  # the API's (way in, tool requests)

    # --- tools ---------------------------------------------------------------------------

    async def execute_tool(self, tenant: str, user: str, req: ToolCallRequest,
                           principal: Principal,
                           idempotency_key: str | None = None) -> ToolResult:
        self.p.counters.tool_calls += 1
        try:
            args = parse_arguments(req.name, req.arguments)
            if req.name == "memory_search":
                return await self._memory_search(tenant, user, req, args)
            if req.name == "conversation_search":
                return await self._conversation_search(tenant, user, req, args)
            return await self._write(tenant, user, req, args, principal, idempotency_key)
        except ToolError as exc:
            return ToolResult(tool_call_id=req.tool_call_id, name=req.name, status="error",
                              content=f"error: {exc}", data={"code": exc.code})

    async def _memory_search(self, tenant: str, user: str, req: ToolCallRequest,
                             args: Any) -> ToolResult:
        started = time.perf_counter()
        q = self._query(tenant, user, args.query, args.k)
        query_id, found = await self._recall(q, procedural=False, core=False)
        self._hits(q, query_id, found.scored)
        self._served(started, found.scored)
        lines = [f"{i}. ({datetime.fromtimestamp(x.memory.valid_from, UTC):%Y-%m-%d}) "
                 f"{x.memory.content}" for i, x in enumerate(found.scored, start=1)]
        return ToolResult(tool_call_id=req.tool_call_id, name=req.name, status="ok",
                          content="\n".join(lines) or "no memories found",
                          data={"query_id": query_id,
                                "memories": [retrieval.scored_dict(x) for x in found.scored]})

    async def _conversation_search(self, tenant: str, user: str, req: ToolCallRequest,
                                   args: Any) -> ToolResult:
        """The user's archive (every past conversation, or one, in a time range), and the
        session's recent messages not archived yet (the window); without the archive, the
        window of one session only."""
        session = args.session_id or (None if self.p.settings.archive else req.session_id)
        if not session and not self.p.settings.archive:
            raise ToolError("invalid_arguments", "conversation_search needs a session_id")
        if session and not ID_PATTERN.fullmatch(session):
            raise ToolError("invalid_arguments", "session_id is not a valid session id")
        limit = args.limit or 10
        current = session or req.session_id
        rows = window.rows(self.p.window, tenant, user, current,
                           window.keep(self.p.settings)) if current else []
        since, until = (None if t is None else  # a time without a zone is UTC
                        (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
                        for t in (args.since, args.until))
        rows = [r for r in rows if _within(r[4], since, until)]
        hits = short_term.search(rows, args.query, limit)
        found = await self.archive_search(tenant, user, args.query, limit,
                                          session, since, until)
        turns = [(i.turn, i.replaced) for i in found if i.turn is not None]
        seen = {t.message_id for t, _ in turns}
        messages: list[dict[str, Any]] = [{
            "seq": t.seq, "message_id": t.message_id, "role": t.role, "content": t.content,
            "ts": datetime.fromtimestamp(t.ts, UTC).isoformat(), "session_id": t.session_id,
            **({"no_longer_true": stale_mark(r)} if r is not None else {})} for t, r in turns]
        messages += [{**w.model_dump(), "session_id": current}
                     for w in window_out(hits) if w.message_id not in seen]
        messages = messages[:limit]
        lines = [f"[{m['ts'][:16]}] {m['role']}: {m['content']}"
                 + (f" ({m['no_longer_true']})" if "no_longer_true" in m else "")
                 for m in messages]
        return ToolResult(tool_call_id=req.tool_call_id, name=req.name, status="ok",
                          content="\n".join(lines) or "no matching messages",
                          data={"messages": messages})

    async def _write(self, tenant: str, user: str, req: ToolCallRequest, args: Any,
                     principal: Principal, idempotency_key: str | None) -> ToolResult:
        if req.name == "core_memory_replace":
            current = await asyncio.to_thread(retrieval.core_blocks, self.p.services.store,
                                              self._query(tenant, user, "-", 1),
                                              privacy.fenced(self.p, tenant, user))
            replace_core(current.get(args.label, ""), args.old_content, args.new_content)
            write = ToolWrite(name="core_memory_replace", label=args.label,
                              old_content=args.old_content, content=args.new_content)
        else:
            write = ToolWrite(name="memory_insert", content=args.content,
                              importance=args.importance or 5,
                              memory_type=args.type or "episodic")
        snap = self.p.state.get(f"{tenant}/{user}".encode()) or {}
        if len(snap.get("tools") or ()) >= self.p.policy.max_queued_tools:
            raise ToolError("queue_full", "too many memory writes waiting for this user; "
                            "retry later")
        request_id = _request_id(req.tool_call_id, write, idempotency_key)
        if req.tool_call_id:
            write = write.model_copy(update={"call_id": req.tool_call_id})
        job_id = tool_job_id(tenant, user, request_id)
        future = self.p.waiters.expect(job_id)
        request = ToolRequest(request_id=request_id, tenant_id=tenant, user_id=user,
                              session_id=req.session_id, write=write,
                              principal=principal.key_id,
                              ts=datetime.fromtimestamp(self.p.clock(), UTC))
        try:
            await self._send(request)
        except BaseException:
            self.p.waiters.resolve(job_id, Outcome("failed", error="not sent"))
            raise
        outcome = await self.p.waiters.wait(job_id, future, req.wait_s)
        return self._write_result(req, request_id, job_id, outcome)

    @staticmethod
    def _write_result(req: ToolCallRequest, request_id: str, job_id: str,
                      outcome: Outcome | None) -> ToolResult:
        data: dict[str, Any] = {"request_id": request_id, "job_id": job_id}
        if outcome is None:
            return ToolResult(tool_call_id=req.tool_call_id, name=req.name, status="queued",
                              content="accepted: the memory write is queued", data=data)
        data["changes"] = outcome.changes
        if outcome.error or outcome.status == "failed":
            return ToolResult(tool_call_id=req.tool_call_id, name=req.name, status="error",
                              content=f"error: {outcome.error or 'the write failed'}",
                              data=data)
        done = ", ".join(f"{c['op']} {c['content']!r}" for c in outcome.changes)
        return ToolResult(tool_call_id=req.tool_call_id, name=req.name, status="ok",
                          content=f"done: {done}" if done else "done: already known", data=data)

    async def _send(self, request: ToolRequest) -> None:
        producer = await self.ingest.started()
        await producer.send_and_wait(self.p.topics.tool_requests.name,
                                     key=request.key().encode(), value=request.dumps())

    # --- history and corrections (web.backend_history) ------------------------------------

    async def history(self, tenant: str, user: str, memory_id: str) -> HistoryResponse:
        return await history.history(self.p, tenant, user, memory_id)

    async def source(self, tenant: str, user: str, memory_id: str,
                     version: int | None) -> SourceResponse:
        return await history.source(self.p, tenant, user, memory_id, version)

    async def changes(self, tenant: str, user: str, *, limit: int,
                      cursor: str | None) -> ChangePage:
        return await history.changes(self.p, tenant, user, page_offset(cursor), limit,
                                        page_token)

    async def correct(self, tenant: str, user: str, write: ToolWrite, req: CorrectionRequest,
                      principal: Principal,
                      idempotency_key: str | None = None) -> CorrectionResult:
        return await history.correct(self.p, self._send, tenant, user, write, req,
                                     principal, idempotency_key)

    async def forget(self, tenant: str, user: str, req: CorrectionRequest,
                     principal: Principal,
                     idempotency_key: str | None = None) -> CorrectionResult:
        return await history.forget(self.p, self._send, tenant, user, req, principal,
                                    idempotency_key)

    async def residue(self, tenant: str, user: str) -> Residue:
        scope = Scope(tenant, user)

        def count() -> int:  # not fenced: this is what is physically there
            return held_records(self.p.services.store, scope)

        return Residue(store_records=await asyncio.to_thread(count))

    async def audit(self, tenant: str, *, limit: int, cursor: str | None, user: str | None,
                    kind: str | None) -> AuditPage:
        if self.audit_log is None:
            raise ApiError(503, ErrorCode.UNAVAILABLE, "the audit log is not followed here")
        offset = page_offset(cursor)
        rows, more = self.audit_log.page(tenant, offset=offset, limit=limit, user=user,
                                         kind=kind)
        return AuditPage.model_validate({
            "entries": rows, "next_cursor": page_token(offset + limit) if more else None})

    # --- the HTTP way in (web.backend_ingest) ---------------------------------------------

    async def add_messages(self, tenant: str, user: str, req: MessagesRequest,
                           idempotency_key: str | None = None) -> MessagesAccepted:
        return await ingest.add_messages(self.p, self.ingest, tenant, user, req,
                                         idempotency_key)

    async def end_session(self, tenant: str, user: str, session: str,
                          req: SessionEndRequest) -> SessionEndAccepted:
        return await ingest.end_session(self.p, self.ingest, tenant, user, session, req)

    async def close(self) -> None:
        await self.ingest.close()
        if self.batcher is not None:
            self.batcher.close()


def _within(iso: str, since: float | None, until: float | None) -> bool:
    try:
        at = datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return since is None and until is None
    return (since is None or at >= since) and (until is None or at < until)
