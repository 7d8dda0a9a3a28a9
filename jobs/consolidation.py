"""Consolidation (SPEC §6): duplicates merged, the newest of contradictions kept, what
outlived its time to live expired. A pure planner; the decision maker (rules or LLM) judges
each similar pair, as it judges an extracted candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memstream.memory.decisions import Candidate, Context, Decision
from memstream.memory.embedding import cosine
from memstream.memory.model import Memory, OpKind, Status
from memstream.memory.plan import Plan, age, close, eligible, expire, expired, is_reflection, revise

Decide = Callable[[Candidate, list[tuple[int, Memory, float]], float], Decision]


def candidate_from(m: Memory) -> Candidate:
    return Candidate(m.content, m.type, m.importance, slot=m.slot)


def plan_consolidation(memories: Sequence[Memory], vectors: Sequence[list[float]],
                       threshold: float, decide: Decide, now: float, ctx: Context) -> Plan:
    """Merge duplicates, keep the newest of contradictions, expire what outlived its TTL.

    Similar pairs (cosine >= ``threshold``, most similar first) are only candidates: the
    decision maker judges each, shown the older memory as number 1 and the newer as the
    candidate. NOOP (the same thing) merges the newer into the older; UPDATE or DELETE (the
    same thing, changed) closes the older; ADD (different things) leaves both. A memory takes
    part in one change per run. Reflections are summaries, never merged with their evidence.
    """
    if len(memories) != len(vectors):
        raise ValueError(f"{len(memories)} memories but {len(vectors)} vectors")
    plan = Plan()
    pool: list[int] = []
    for i in eligible(memories, ctx):
        if expired(memories[i], now):
            expire(plan, ctx, memories[i], now)
        elif not is_reflection(memories[i]):
            pool.append(i)
    pairs = [(cosine(vectors[i], vectors[j]), i, j)
             for a, i in enumerate(pool) for j in pool[a + 1:]]
    pairs = sorted((p for p in pairs if p[0] >= threshold), key=lambda p: (-p[0], p[1], p[2]))
    used: set[int] = set()
    for score, i, j in pairs:
        if i in used or j in used:
            continue
        older, newer = sorted((memories[i], memories[j]), key=age)
        decision = decide(candidate_from(newer), [(1, older, score)], threshold)
        if decision.op == OpKind.NOOP:
            _merge(plan, ctx, older, newer, now)
        elif decision.op in (OpKind.UPDATE, OpKind.DELETE):
            close(plan, ctx, older, Status.SUPERSEDED, now, now,
                   f"superseded by {newer.memory_id}: {decision.reason or 'changed'}",
                   "superseded", superseded_by=newer.memory_id)
        else:
            continue
        used |= {i, j}
    return plan


def _merge(plan: Plan, ctx: Context, older: Memory, newer: Memory, now: float) -> None:
    """The survivor first (a crash in between leaves both live, never neither)."""
    merged = sorted({*older.extra.get("merged", ()), *newer.extra.get("merged", ()),
                     newer.memory_id})
    expires = None if None in (older.expires_at, newer.expires_at) else max(
        older.expires_at or 0.0, newer.expires_at or 0.0)
    revise(plan, ctx, older, now, f"merged {newer.memory_id} into it: duplicate", "merged",
            importance=max(older.importance, newer.importance), slot=older.slot or newer.slot,
            updated_at=max(older.updated_at, newer.updated_at), expires_at=expires,
            extra={**older.extra, "merged": merged})
    close(plan, ctx, newer, Status.SUPERSEDED, now, now,
           f"merged into {older.memory_id}: duplicate", None, merged_into=older.memory_id)
