"""The worker's side of the HTTP API: the :class:`~memstream.web.http.Backend` that
answers from the store, the window table and the pipeline, and its start / stop.

Reads run in a worker thread against the store the stages write (the embedded store
lives in this process); they never wait on Kafka: hits go to the
:class:`~memstream.streams.access.AccessRecorder` queue. Tool writes are sent to the
tool-requests topic and become jobs of the user (see :mod:`memory.toolwrite`); the call
waits (``wait_s``) for the apply stage to report the job's changes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer

from memstream.core import kafka
from memstream.memory import retrieval
from memstream.memory import window as windows
from memstream.memory.coalescing import tool_job_id
from memstream.memory.model import Memory, MemoryType
from memstream.memory.prompt_block import prompt_block
from memstream.memory.scoring import Scored
from memstream.memory.services import weights
from memstream.memory.store import Scope
from memstream.memory.tools import TOOLS, ToolError, parse_arguments, replace_core
from memstream.streams import privacy, window
from memstream.streams.access import AccessRecorder, access_event
from memstream.streams.app import Pipeline
from memstream.streams.waiters import Outcome
from memstream.topics.schemas import ID_PATTERN, ToolRequest, ToolWrite
from memstream.web import history
from memstream.web.http import ApiError
from memstream.web.models.api import (
    Accepted,
    ContextRequest,
    ContextResponse,
    ErrorCode,
    FeedbackRequest,
    MemoryPage,
    Principal,
    SearchRequest,
    SearchResponse,
    ToolCallRequest,
    ToolResult,
    WindowMessage,
)
from memstream.web.models.history import (
    AuditPage,
    ChangePage,
    CorrectionRequest,
    CorrectionResult,
    HistoryResponse,
    Residue,
    SourceResponse,
)

log = logging.getLogger(__name__)
LIST_MAX = 10_000  # version records of one user a list call reads


def _page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode()


def _page_offset(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        offset = int(json.loads(base64.urlsafe_b64decode(cursor.encode()))["o"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, ErrorCode.BAD_REQUEST, "cursor is not one this API gave") from exc
    if offset < 0:
        raise ApiError(400, ErrorCode.BAD_REQUEST, "cursor is not one this API gave")
    return offset


def _request_id(tool_call_id: str | None, write: ToolWrite) -> str:
    """The request's id: the model's tool call id *and* what it asks, so a retried call is
    taken once while a framework reusing ids ("call_0") for different writes loses none."""
    what = write.model_dump_json(exclude={"request_id", "call_id", "principal"})
    raw = f"{tool_call_id or uuid.uuid4().hex}\x1f{what}"
    return "tc-" + hashlib.sha256(raw.encode()).hexdigest()[:40]


def _window_out(rows: list[windows.Row]) -> list[WindowMessage]:
    return [WindowMessage(seq=r[0], message_id=r[1], role=r[2], content=r[3], ts=r[4])
            for r in rows]


def _fence(p: Pipeline, tenant: str, user: str, found: retrieval.Recall) -> retrieval.Recall:
    """A forget-me hides the user's memories created before it, at once (privacy.visible)."""
    at = privacy.fenced(p, tenant, user)
    if at is None:
        return found

    def shown(m: Memory) -> bool:
        return m.user_id != user or m.created_at > at  # global knowledge is not theirs

    scored = [x for x in found.scored if shown(x.memory)]
    core = retrieval.core_blocks(p.services.store, retrieval.Query(tenant, user, "-", 1),
                                 created_after=at) if found.core else {}
    return retrieval.Recall(scored, [m for m in found.procedural if shown(m)], core)


class WorkerBackend:
    """Answers the API from this worker's store and tables."""

    def __init__(self, p: Pipeline, recorder: AccessRecorder) -> None:
        self.p = p
        self.recorder = recorder
        self.started = False
        self._producer: AIOKafkaProducer | None = None
        self._producer_lock = asyncio.Lock()
        self.audit_log: Any = None  # memstream.web.audit.AuditLog, started by streams.serve

    def ready(self) -> bool:
        """Serving, and the tables (window, ingest state) restored after a (re)start: until
        then answers would be silently incomplete, so the API says 503."""
        if not self.started:
            return False
        keys = self.p.user_keys
        if keys is not None and not keys.ready:  # forget-me markers not all known yet
            return False
        try:
            tables: Any = self.p.app.tables
            return bool(tables.recovery.completed.is_set())
        except AttributeError:  # no table manager (not a Faust worker): nothing to restore
            return True

    def tools(self) -> list[dict[str, Any]]:
        return TOOLS

    # --- reads ---------------------------------------------------------------------------

    def _query(self, tenant: str, user: str, text: str, k: int | None, **kw: Any,
               ) -> retrieval.Query:
        return retrieval.Query(tenant, user, text, k or self.p.settings.retrieval_k, **kw)

    async def _recall(self, q: retrieval.Query, *, procedural: bool = True,
                      core: bool = True) -> tuple[str, retrieval.Recall]:
        s = self.p.services
        found = await asyncio.to_thread(
            retrieval.recall, s.store, s.embedder, q, self.p.clock(), weights(self.p.settings),
            self.p.settings.retrieval_candidates, procedural=procedural, core=core)
        self.p.counters.searches += 1
        return uuid.uuid4().hex, _fence(self.p, q.tenant_id, q.user_id, found)

    def _hits(self, q: retrieval.Query, query_id: str, returned: list[Scored]) -> None:
        """Record what the caller was given (queued: the read never waits on Kafka)."""
        if not returned:
            return
        ids = [x.memory.memory_id for x in returned]
        self.recorder.record(access_event(q.tenant_id, q.user_id, "hit", ids, query_id,
                                          query_id, self.p.clock()))
        self.p.counters.hits_recorded += len(ids)

    def _served(self, started: float, returned: list[Scored]) -> None:
        """A retrieval answered: its latency, and whether it found a relevant memory (the
        best one returned at or above ``metrics_hit_relevance``: the hit rate, SPEC §8)."""
        c = self.p.counters
        c.retrieval_latency.observe(time.perf_counter() - started)
        floor = self.p.settings.metrics_hit_relevance
        if floor is None:
            floor = self.p.services.embedder.related_threshold
        if any(x.relevance >= floor for x in returned):
            c.retrievals_with_results += 1

    async def list_memories(self, tenant: str, user: str, *, limit: int, cursor: str | None,
                            status: str | None, type: str | None) -> MemoryPage:
        offset = _page_offset(cursor)
        statuses = None if status == "all" else [status or "active"]
        types = [MemoryType(type).value] if type else None
        store = self.p.services.store

        def read() -> tuple[list[Memory], bool]:
            # The store scrolls in point-id order: read the user's records (bounded), sort by
            # creation, then cut the page, so pages are stable.
            found = privacy.visible(self.p, tenant, user,
                                    store.list(Scope(tenant, user), statuses, LIST_MAX,
                                               types=types))
            found.sort(key=lambda m: (m.created_at, m.memory_id, m.version))
            page = retrieval.join_stats(store, tenant, user, found[offset:offset + limit])
            return page, len(found) > offset + limit

        page, more = await asyncio.to_thread(read)
        return MemoryPage.model_validate({
            "memories": [retrieval.memory_dict(m) for m in page],
            "next_cursor": _page_token(offset + limit) if more else None})

    async def search(self, tenant: str, user: str, req: SearchRequest) -> SearchResponse:
        started = time.perf_counter()
        q = self._query(tenant, user, req.query, req.k, include_global=req.include_global,
                        statuses=tuple(req.statuses), include_expired=req.include_expired)
        query_id, found = await self._recall(q, core=False)
        if req.record_hits:
            self._hits(q, query_id, found.scored)
        self._served(started, found.scored)
        return SearchResponse.model_validate({
            "query_id": query_id, "memories": [retrieval.scored_dict(x) for x in found.scored],
            "procedural": [retrieval.memory_dict(m) for m in found.procedural]})

    async def context(self, tenant: str, user: str, req: ContextRequest) -> ContextResponse:
        started = time.perf_counter()
        q = self._query(tenant, user, req.query, req.k)
        query_id, found = await self._recall(q)
        rows = (window.rows(self.p.window, tenant, user, req.session_id,
                            self.p.settings.short_term_turns) if req.session_id else [])
        block = prompt_block(found.core, found.scored, found.procedural,
                             budget_chars=req.budget_chars, budget_tokens=req.budget_tokens)
        kept = found.scored[:block.kept]  # what the budget let in: only these count as hits
        if req.record_hits:
            self._hits(q, query_id, kept)
        self._served(started, kept)
        return ContextResponse.model_validate({
            "query_id": query_id, "memories": [retrieval.scored_dict(x) for x in kept],
            "procedural": [retrieval.memory_dict(m) for m in found.procedural],
            "core": found.core, "window": [w.model_dump() for w in _window_out(rows)],
            "prompt_block": block.text, "truncated": block.truncated})

    async def feedback(self, tenant: str, user: str, req: FeedbackRequest) -> Accepted:
        scope = Scope(tenant, user, include_global=True)
        known = await asyncio.to_thread(self.p.services.store.live_versions, scope,
                                        [req.memory_id])
        if not known:  # only memories this user can see: no statistics for made-up ids
            raise ApiError(404, ErrorCode.NOT_FOUND, "no live memory with this id for the user")
        kind = "used" if req.useful else "not_useful"
        # The same feedback counts once; changing one's mind counts both.
        event_id = "fb-" + hashlib.sha256("\x1f".join(
            [tenant, user, req.query_id, req.memory_id, kind]).encode()).hexdigest()[:40]
        self.recorder.record(access_event(tenant, user, kind, [req.memory_id], req.query_id,
                                          event_id, self.p.clock()))
        if req.useful:
            self.p.counters.feedback_used += 1
        else:
            self.p.counters.feedback_not_useful += 1
        return Accepted(id=event_id)

    # --- tools ---------------------------------------------------------------------------

    async def execute_tool(self, tenant: str, user: str, req: ToolCallRequest,
                           principal: Principal) -> ToolResult:
        self.p.counters.tool_calls += 1
        try:
            args = parse_arguments(req.name, req.arguments)
            if req.name == "memory_search":
                return await self._memory_search(tenant, user, req, args)
            if req.name == "conversation_search":
                return self._conversation_search(tenant, user, req, args)
            return await self._write(tenant, user, req, args, principal)
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

    def _conversation_search(self, tenant: str, user: str, req: ToolCallRequest,
                             args: Any) -> ToolResult:
        session = args.session_id or req.session_id
        if not session:
            raise ToolError("invalid_arguments", "conversation_search needs a session_id")
        if not ID_PATTERN.fullmatch(session):
            raise ToolError("invalid_arguments", "session_id is not a valid session id")
        rows = window.rows(self.p.window, tenant, user, session, window.keep(self.p.settings))
        hits = windows.search(rows, args.query, args.limit or 10)
        lines = [f"[{r[4][:16]}] {r[2]}: {r[3]}" for r in hits]
        return ToolResult(tool_call_id=req.tool_call_id, name=req.name, status="ok",
                          content="\n".join(lines) or "no matching messages",
                          data={"messages": [w.model_dump() for w in _window_out(hits)]})

    async def _write(self, tenant: str, user: str, req: ToolCallRequest, args: Any,
                     principal: Principal) -> ToolResult:
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
        request_id = _request_id(req.tool_call_id, write)
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
        async with self._producer_lock:
            if self._producer is None:
                producer = kafka.producer(self.p.settings, enable_idempotence=True, acks="all")
                await producer.start()
                self._producer = producer
        await self._producer.send_and_wait(self.p.topics.tool_requests.name,
                                           key=request.key().encode(), value=request.dumps())

    # --- history and corrections (streams.governance) ------------------------------------

    async def history(self, tenant: str, user: str, memory_id: str) -> HistoryResponse:
        return await history.history(self.p, tenant, user, memory_id)

    async def source(self, tenant: str, user: str, memory_id: str,
                     version: int | None) -> SourceResponse:
        return await history.source(self.p, tenant, user, memory_id, version)

    async def changes(self, tenant: str, user: str, *, limit: int,
                      cursor: str | None) -> ChangePage:
        return await history.changes(self.p, tenant, user, _page_offset(cursor), limit,
                                        _page_token)

    async def correct(self, tenant: str, user: str, write: ToolWrite, req: CorrectionRequest,
                      principal: Principal) -> CorrectionResult:
        return await history.correct(self.p, self._send, tenant, user, write, req,
                                        principal)

    async def forget(self, tenant: str, user: str, req: CorrectionRequest,
                     principal: Principal) -> CorrectionResult:
        return await history.forget(self.p, self._send, tenant, user, req, principal)

    async def residue(self, tenant: str, user: str) -> Residue:
        scope = Scope(tenant, user)

        def count() -> int:  # not fenced: this is what is physically there
            return len(self.p.services.store.list(scope, statuses=None, limit=LIST_MAX))

        return Residue(store_records=await asyncio.to_thread(count))

    async def audit(self, tenant: str, *, limit: int, cursor: str | None, user: str | None,
                    kind: str | None) -> AuditPage:
        if self.audit_log is None:
            raise ApiError(503, ErrorCode.UNAVAILABLE, "the audit log is not followed here")
        offset = _page_offset(cursor)
        rows, more = self.audit_log.page(tenant, offset=offset, limit=limit, user=user,
                                         kind=kind)
        return AuditPage.model_validate({
            "entries": rows, "next_cursor": _page_token(offset + limit) if more else None})

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
