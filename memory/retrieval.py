"""Retrieval (SPEC §5): filter by tenant and user (plus the global scope), vector search
wider than k, join the hit statistics, drop what must not come back, rank, and gather the
blocks a prompt needs (procedural rules, core memory). Pure over the store protocol; the
HTTP API (:mod:`memstream.web.backend`) and the CLI call it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from memstream.memory.access_stats import AccessStats
from memstream.memory.embedding import Embedder
from memstream.memory.hybrid import Fusion, Item, fuse, meaning_query, recall_turns
from memstream.memory.model import GLOBAL_USER, Memory, MemoryType
from memstream.memory.scoring import Scored, Weights, rank, visible
from memstream.memory.store import MemoryStore, Scope
from memstream.memory.toolwrite import CORE_SLOTS

MIN_CANDIDATES = 20
MAX_PROCEDURAL = 50  # rules in the block: the user's own first, most important first
MAX_RULES_READ = 1_000
RANKED_TYPES = (MemoryType.SEMANTIC.value, MemoryType.EPISODIC.value)


@dataclass(frozen=True)
class Query:
    tenant_id: str
    user_id: str
    text: str
    k: int = 5
    include_global: bool = True
    statuses: Collection[str] = ("active",)
    include_expired: bool = False


@dataclass(frozen=True)
class Recall:
    scored: list[Scored]
    procedural: list[Memory] = field(default_factory=list)
    core: dict[str, str] = field(default_factory=dict)
    # memories and archived turns fused (memory.hybrid); empty without a fusion asked for
    items: list[Item] = field(default_factory=list)


def with_stats(memory: Memory, stats: AccessStats | None) -> Memory:
    if stats is None:
        return memory
    return memory.evolve(last_accessed_at=stats.last_accessed_at,
                         access_count=stats.access_count)


def candidates_for(q: Query, factor: int) -> int:
    return max(q.k * factor, MIN_CANDIDATES)


def join_stats(store: MemoryStore, tenant_id: str, user_id: str,
               memories: Sequence[Memory]) -> list[Memory]:
    """Memories with the reading user's hit statistics (a global memory's too: recency is
    per reader)."""
    stats = store.access_stats(Scope(tenant_id, user_id),
                               list(dict.fromkeys(m.memory_id for m in memories)))
    return [with_stats(m, stats.get(m.memory_id)) for m in memories]


def ranked(store: MemoryStore, vector: list[float], q: Query, now: float, weights: Weights,
           factor: int = 4, keep: int | None = None) -> list[Scored]:
    """The top k (``keep``) of the wider candidate set, scored (procedural and core
    memories apart)."""
    scope = Scope(q.tenant_id, q.user_id, include_global=q.include_global)
    # Rules and core blocks are filtered in the search itself: many rules near the query
    # must not crowd the facts out of the candidate set.
    hits = store.search(scope, vector, candidates_for(q, factor), list(q.statuses),
                        types=RANKED_TYPES, exclude_slots=CORE_SLOTS)
    hits = [(m, s) for m, s in hits if visible(m, now, q.statuses, q.include_expired)]
    joined = join_stats(store, q.tenant_id, q.user_id, [m for m, _ in hits])
    return rank(list(zip(joined, [s for _, s in hits], strict=True)), now, weights,
                q.k if keep is None else keep)


def rules(store: MemoryStore, q: Query, now: float) -> list[Memory]:
    """The rules of how to act: returned as a block, not searched by similarity."""
    scope = Scope(q.tenant_id, q.user_id, include_global=q.include_global)
    found = store.list(scope, limit=MAX_RULES_READ, types=[MemoryType.PROCEDURAL.value])
    found = [m for m in found if m.slot not in CORE_SLOTS and visible(m, now)]
    # The user's own rules first, then the global ones; most important first.
    found.sort(key=lambda m: (m.user_id == GLOBAL_USER, -m.importance, m.created_at))
    return found[:MAX_PROCEDURAL]


def core_blocks(store: MemoryStore, q: Query, created_after: float | None = None,
                ) -> dict[str, str]:
    """The user's core memory blocks by label; ``created_after``: only blocks created
    after it (a forget-me hides older ones until the erasure has run)."""
    found = store.list(Scope(q.tenant_id, q.user_id), slots=list(CORE_SLOTS),
                       limit=len(CORE_SLOTS) * 4)
    return {m.slot.split(":", 1)[1]: m.content for m in sorted(found, key=lambda m: m.version)
            if m.slot and (created_after is None or m.created_at > created_after)}


def recall(store: MemoryStore, embedder: Embedder, q: Query, now: float, weights: Weights,
           factor: int = 4, *, procedural: bool = True, core: bool = True,
           fusion: Fusion | None = None) -> Recall:
    """Everything one retrieval returns: the ranked memories, plus (when asked for) the
    procedural rules, the core memory blocks, and the memories fused with the user's
    archived turns."""
    if not q.text.strip():
        return Recall([])
    texts = list(dict.fromkeys([q.text, meaning_query(q.text)] if fusion else [q.text]))
    vectors = embedder.embed(texts)
    return recall_near(store, vectors[0], q, now, weights, factor, procedural=procedural,
                       core=core, fusion=fusion, turn_vector=vectors[-1])


def recall_near(store: MemoryStore, vector: list[float], q: Query, now: float,
                weights: Weights, factor: int = 4, *, procedural: bool = True,
                core: bool = True, fusion: Fusion | None = None,
                turn_vector: list[float] | None = None) -> Recall:
    """:func:`recall` with the query's vector already made (the API embeds concurrent
    queries together: :mod:`memstream.web.read_batching`); ``turn_vector``: the vector the
    turns are searched by meaning with (:func:`memory.hybrid.meaning_query`'s; default
    ``vector``)."""
    items: list[Item] = []
    if fusion is None:
        scored = ranked(store, vector, q, now, weights, factor)
    else:  # every candidate may lead the fused answer (one that shares the query's words,
        everyone = ranked(store, vector, q, now, fusion.memory_weights(weights), factor,
                          keep=candidates_for(q, factor))  # whatever its score)
        scored = everyone[:q.k]
        dense, sparse, truth = recall_turns(store, Scope(q.tenant_id, q.user_id),
                                            turn_vector or vector, q.text, fusion, now)
        items = fuse(everyone, dense, sparse, fusion, q.k, query=q.text, truth=truth)
    return Recall(scored, rules(store, q, now) if procedural else [],
                  core_blocks(store, q) if core else {}, items)


def memory_dict(m: Memory) -> dict[str, Any]:
    """A memory as the API shows it (contract.http_api.api.MemoryOut)."""
    return {"memory_id": m.memory_id, "version": m.version, "type": m.type.value,
            "content": m.content, "importance": m.importance, "status": m.status.value,
            "scope": "global" if m.user_id == GLOBAL_USER else "user", "slot": m.slot,
            "created_at": m.created_at, "updated_at": m.updated_at,
            "valid_from": m.valid_from, "valid_to": m.valid_to, "expires_at": m.expires_at,
            "last_accessed_at": m.last_accessed_at, "access_count": m.access_count}


def item_dict(item: Item, line: str | None = None) -> dict[str, Any]:
    """A fused result as the API shows it (contract.http_api.api.RecallItem): its kind, text, score,
    event time and source ids; for a turn whose statement was replaced, how and by what
    (``stale``, ``valid_to``, ``superseded_by``); ``line``: what the prompt block shows."""
    if item.memory is not None:
        m = item.memory.memory
        return {"kind": "memory", "id": m.memory_id, "content": m.content,
                "score": round(item.score, 6), "event_time": m.stated_ts or m.valid_from,
                "session_id": m.source.session_id, "message_ids": list(m.source.message_ids),
                "role": None, "context": None, "line": line,
                "newer_turn": None if item.newer is None else item.newer.memory_id}
    t, r = item.turn, item.replaced
    assert t is not None
    return {"kind": "turn", "id": t.memory_id, "content": t.content,
            "score": round(item.score, 6), "event_time": t.ts, "session_id": t.session_id,
            "message_ids": list(t.message_ids), "role": t.role,
            "context": None if not t.context else {
                "role": str(t.context.get("role", "")),
                "content": str(t.context.get("content", ""))},
            "line": line, "stale": None if r is None else r.kind,
            "valid_to": None if r is None else r.at,
            "superseded_by": None if r is None or r.current is None else {
                "memory_id": r.current.memory_id, "version": r.current.version,
                "content": r.current.content,
                "event_time": r.current.stated_ts or r.current.valid_from}}


def scored_dict(s: Scored) -> dict[str, Any]:
    return {**memory_dict(s.memory), "score": round(s.score, 6), "recency": round(s.recency, 6),
            "importance_score": round(s.importance, 6), "relevance": round(s.relevance, 6)}
