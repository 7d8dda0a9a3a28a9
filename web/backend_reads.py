"""The read side of the worker's HTTP backend: readiness, the memory list, search,
context and feedback, answered from this worker's store and tables in a worker thread.
They never wait on Kafka: hits go to the :class:`~memstream.streams.access.AccessRecorder`
queue. :class:`~memstream.web.backend.WorkerBackend` adds the writes (agent tools,
corrections) to it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
import uuid
from dataclasses import replace
from typing import Any

from memstream.contract.http_api.api import (
    Accepted,
    ContextRequest,
    ContextResponse,
    ErrorCode,
    FeedbackRequest,
    Health,
    MemoryPage,
    SearchRequest,
    SearchResponse,
    WindowMessage,
)
from memstream.memory import retrieval, services, short_term
from memstream.memory.hybrid import Fusion, Item, fuse, meaning_query, recall_turns
from memstream.memory.model import Memory, MemoryType
from memstream.memory.prompt_block import excerpt_line, fused_block, memory_line
from memstream.memory.scoring import Scored
from memstream.memory.services import weights
from memstream.memory.store import Scope, TurnWindow
from memstream.memory.tools import TOOLS
from memstream.streams import privacy, window
from memstream.streams.access import AccessRecorder, access_event
from memstream.streams.pipeline import Pipeline
from memstream.streams.readiness import readiness, restoring
from memstream.web.http_base import ApiError
from memstream.web.read_batching import ReadBatcher

LIST_MAX = 10_000  # version records of one user a list call reads


def page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode()


def page_offset(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        offset = int(json.loads(base64.urlsafe_b64decode(cursor.encode()))["o"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, ErrorCode.BAD_REQUEST, "cursor is not one this API gave") from exc
    if offset < 0:
        raise ApiError(400, ErrorCode.BAD_REQUEST, "cursor is not one this API gave")
    return offset


def window_out(rows: list[short_term.Row]) -> list[WindowMessage]:
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
    items = [i for i in found.items  # a turn said before the forget-me is the user's too
             if (shown(i.memory.memory) if i.memory is not None
                 else i.turn is not None and i.turn.ts > at)]
    return retrieval.Recall(scored, [m for m in found.procedural if shown(m)], core, items)


def fused_items(found: retrieval.Recall) -> list[Item]:
    """The fused results; without the archive, the memories in their own order."""
    if found.items:
        return found.items
    return [Item("memory", x.score, memory=x) for x in found.scored]


class ReadBackend:
    """Answers the API's reads from this worker's store and tables."""

    def __init__(self, p: Pipeline, recorder: AccessRecorder) -> None:
        self.p = p
        self.recorder = recorder
        self.batcher: ReadBatcher | None = None  # concurrent reads, in batches
        self.started = False

    def ready(self) -> bool:
        """Serving: the API started, the loops joined their groups, the user keys known
        (forget-me markers). Until then every request gets 503."""
        if not self.started:
            return False
        found = readiness(self.p)
        return found.joined and not found.waiting

    def serving(self, tenant: str, user: str) -> bool:
        """The user's partition is not being taken here: its tables (the window) and store
        shard are restored, so an answer is not silently partial (else 503, retry)."""
        return not restoring(self.p, tenant, user)

    def health(self) -> Health:
        """Ready only when every owned partition is restored (``/v1/health``)."""
        found = readiness(self.p)
        waiting = [*([] if self.started else ["api"]), *([] if found.joined else ["joining"]),
                   *found.waiting]
        return Health(status="ok" if found.ready and self.started else "starting",
                      owned=list(found.owned), restoring=list(found.restoring),
                      forwarding=found.forwarding, waiting=waiting)

    def tools(self) -> list[dict[str, Any]]:
        return TOOLS

    # --- reads ---------------------------------------------------------------------------

    def _query(self, tenant: str, user: str, text: str, k: int | None, **kw: Any,
               ) -> retrieval.Query:
        return retrieval.Query(tenant, user, text, k or self.p.settings.retrieval_k, **kw)

    def fusion(self, req: SearchRequest | None = None) -> Fusion | None:
        """How memories and archived turns are fused (None: the archive is off); a search
        request may narrow it to one kind or one way of matching turns."""
        f = services.fusion(self.p.settings, self.p.services.embedder)
        if f is None:
            return None
        if req is not None:
            f = replace(f, sources=req.sources, match=req.turn_match, recency=req.recency)
        return f

    async def _recall(self, q: retrieval.Query, *, procedural: bool = True,
                      core: bool = True, fusion: Fusion | None = None,
                      ) -> tuple[str, retrieval.Recall]:
        found = retrieval.Recall([])
        if q.text.strip():
            s, store = self.p.settings, self.p.services.store
            if self.batcher is None:  # a store across the network: round trips overlap
                self.batcher = ReadBatcher(self.p.services.embedder,
                                           in_flight=1 if s.store == "edge" else 4)
            texts = (q.text, meaning_query(q.text)) if fusion else (q.text,)
            found = await self.batcher.read_all(texts, lambda vs: retrieval.recall_near(
                store, vs[0], q, self.p.clock(), weights(s), s.retrieval_candidates,
                procedural=procedural, core=core, fusion=fusion, turn_vector=vs[-1]))
        self.p.counters.searches += 1
        return uuid.uuid4().hex, _fence(self.p, q.tenant_id, q.user_id, found)

    async def archive_search(self, tenant: str, user: str, text: str, limit: int,
                             session_id: str | None = None, since: float | None = None,
                             until: float | None = None) -> list[Item]:
        """The user's archived turns best matching ``text`` (by meaning and words, fused) in
        one session and/or an event-time range, each with what replaced its statement (if
        something did); none without the archive."""
        f = self.fusion()
        if f is None or not text.strip():
            return []
        f = replace(f, sources="turns")
        store, embedder, at = self.p.services.store, self.p.services.embedder, self.p.clock()
        fence = privacy.fenced(self.p, tenant, user)

        def read() -> list[Item]:
            vector = embedder.embed([meaning_query(text)])[0]
            dense, sparse, truth = recall_turns(store, Scope(tenant, user), vector, text, f, at,
                                                TurnWindow(session_id, since, until))
            return [i for i in fuse([], dense, sparse, f, limit, query=text, truth=truth)
                    if i.turn is not None and (fence is None or i.turn.ts > fence)]

        return await asyncio.to_thread(read)

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
        offset = page_offset(cursor)
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
            "next_cursor": page_token(offset + limit) if more else None})

    async def search(self, tenant: str, user: str, req: SearchRequest) -> SearchResponse:
        started = time.perf_counter()
        q = self._query(tenant, user, req.query, req.k, include_global=req.include_global,
                        statuses=tuple(req.statuses), include_expired=req.include_expired)
        query_id, found = await self._recall(q, core=False, fusion=self.fusion(req))
        if req.record_hits:
            self._hits(q, query_id, found.scored)
        self._served(started, found.scored)
        return SearchResponse.model_validate({
            "query_id": query_id, "memories": [retrieval.scored_dict(x) for x in found.scored],
            "procedural": [retrieval.memory_dict(m) for m in found.procedural],
            "items": [retrieval.item_dict(i) for i in fused_items(found)]})

    async def context(self, tenant: str, user: str, req: ContextRequest) -> ContextResponse:
        started = time.perf_counter()
        q = self._query(tenant, user, req.query, req.k)
        query_id, found = await self._recall(q, fusion=self.fusion())
        rows = (window.rows(self.p.window, tenant, user, req.session_id,
                            self.p.settings.short_term_turns) if req.session_id else [])
        items = fused_items(found)
        block = fused_block(found.core, items, found.procedural,
                            budget_chars=req.budget_chars, budget_tokens=req.budget_tokens)
        kept = list(block.memories)  # what the budget let in: only these count as hits
        kept_evidence = [i.memory for line in block.evidence for i in line
                         if i.memory is not None]
        if req.record_hits:
            self._hits(q, query_id, kept + kept_evidence)
        self._served(started, kept + kept_evidence)
        by_memory = {i.memory.memory.memory_id: i for i in items if i.memory is not None}
        shown = [retrieval.item_dict(by_memory[m.memory.memory_id], memory_line(m.memory))
                 for m in kept]
        shown += [retrieval.item_dict(i, excerpt_line(line)) for line in block.evidence
                  for i in line]
        return ContextResponse.model_validate({
            "query_id": query_id, "memories": [retrieval.scored_dict(x) for x in kept],
            "procedural": [retrieval.memory_dict(m) for m in found.procedural],
            "core": found.core, "window": [w.model_dump() for w in window_out(rows)],
            "prompt_block": block.text, "truncated": block.truncated,
            "items": shown})  # what the prompt block holds, in its order

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
