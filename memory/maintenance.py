"""The windowed jobs' work (SPEC §6) as pure planners: decay, consolidation, reflection.

:mod:`jobs.triggers` decides *when* a job runs; these functions decide *what* it changes.
Each takes one user's live memories (hit statistics joined, :func:`memory.retrieval.join_stats`)
and the time, and returns a :class:`Plan`: planned ops of the same shapes as
:func:`memory.decisions.resolve`, so a maintenance job goes through the same decide → apply
path as extraction (change events with lineage, fenced by the versions in ``Plan.read``,
rebuildable from the memory-change topic). No store, no I/O, no clock.

- Closing a version is a DELETE-kind op whatever the status it leaves (deleted, archived,
  superseded): the memory is no longer live. Changing a memory is an UPDATE-kind op: the old
  version closed (superseded), ``version + 1`` opened.
- A down-weighted version keeps ``updated_at``: it is the time the fact was last asserted,
  which decay measures idleness from; the time of the change is ``valid_from``.
- Version records never carry hit statistics (they live beside them, :mod:`memory.access`):
  the joined ``last_accessed_at`` / ``access_count`` are dropped from every record written.
- Core-memory blocks (slot ``core:*``) are the agent's own: never touched here.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memstream.core.errors import ConfigError
from memstream.memory.decisions import Candidate, Context, Decision, PlannedOp, op_id
from memstream.memory.embedding import cosine
from memstream.memory.model import Memory, MemoryType, OpKind, Status, new_memory_id
from memstream.memory.scoring import decay_weight, last_touched
from memstream.memory.toolwrite import CORE_PREFIX

DAY = 86_400.0
# on a closed version: which op and job closed it, why, of what kind, who asked
CLOSE_MARKS = ("closed_by", "closed_job", "closed_reason", "closed_kind", "closed_actor")
REFLECTION = "reflection"  # extra["kind"] of a reflection memory
REFLECTION_SLOT = "reflection:profile"
REFLECTION_METHOD = "rules-profile-1"
REFLECTION_IMPORTANCE = 8
MAX_REFLECTION_CHARS = 600
MAX_ITEM_CHARS = 160

Decide = Callable[[Candidate, list[tuple[int, Memory, float]], float], Decision]


def is_reflection(m: Memory) -> bool:
    return m.extra.get("kind") == REFLECTION


@dataclass(frozen=True)
class DecayPolicy:
    downweight_days: float = 30
    archive_days: float = 90
    slow_factor: float = 3.0  # reflections and procedural memories decay this many times slower
    weight: float = 0.5  # the down-weight factor written to extra["weight"]

    def __post_init__(self) -> None:
        if not 0 < self.downweight_days <= self.archive_days:
            raise ConfigError("decay needs 0 < downweight_days <= archive_days")
        if self.slow_factor < 1:
            raise ConfigError(f"slow_factor must be >= 1, got {self.slow_factor!r}")
        if not 0 <= self.weight < 1:
            raise ConfigError(f"weight must be in [0, 1), got {self.weight!r}")


@dataclass
class Plan:
    """What one maintenance job changes, and the versions it read (checked at apply time)."""

    ops: list[PlannedOp] = field(default_factory=list)
    read: dict[str, int] = field(default_factory=dict)  # memory id -> version read
    counts: Counter[str] = field(default_factory=Counter)

    def next_id(self, ctx: Context, kind: OpKind) -> str:
        """The id of the op added next (the index is its position: unique in the plan)."""
        return op_id(ctx.job_id, len(self.ops), kind, ctx.seq)

    def add(self, op: PlannedOp, count: str | None) -> None:
        self.ops.append(op)
        if op.before is not None:
            self.read[op.memory_id] = op.before.version
        if count:
            self.counts[count] += 1


# --- shared -------------------------------------------------------------------------------

def _eligible(memories: Sequence[Memory], ctx: Context) -> list[int]:
    """Indices of the memories a job may act on: the user's live, non-core memories, the
    highest live version of each (a half-applied change can leave two), by memory id."""
    best: dict[str, int] = {}
    for i, m in enumerate(memories):
        if (not m.live or (m.slot or "").startswith(CORE_PREFIX)
                or (m.tenant_id, m.user_id) != (ctx.tenant_id, ctx.user_id)):
            continue
        if m.memory_id not in best or memories[best[m.memory_id]].version < m.version:
            best[m.memory_id] = i
    return [best[k] for k in sorted(best)]


def _bare(m: Memory) -> Memory:
    return m.evolve(last_accessed_at=None, access_count=0)


def _expired(m: Memory, now: float) -> bool:
    return m.expires_at is not None and m.expires_at <= now


def _close(plan: Plan, ctx: Context, m: Memory, status: Status, valid_to: float, now: float,
           reason: str, count: str | None, **marks: Any) -> None:
    """A DELETE-kind op: the live version closed with ``status`` (content kept)."""
    oid = plan.next_id(ctx, OpKind.DELETE)
    before = _bare(m)
    closed = before.evolve(status=status, valid_to=valid_to, updated_at=now,
                           extra={**before.extra, **marks, "closed_by": oid,
                                  "closed_job": ctx.job_id})
    plan.add(PlannedOp(oid, OpKind.DELETE, m.memory_id, before, closed, (closed,), reason), count)


def _revise(plan: Plan, ctx: Context, m: Memory, now: float, reason: str, count: str | None,
            **changes: Any) -> None:
    """An UPDATE-kind op: the live version superseded, ``version + 1`` opened with
    ``changes`` (``updated_at`` is kept unless changed: see the module docstring)."""
    oid = plan.next_id(ctx, OpKind.UPDATE)
    before = _bare(m)
    closed = before.evolve(status=Status.SUPERSEDED, valid_to=now, updated_at=now,
                           extra={**before.extra, "closed_by": oid, "closed_job": ctx.job_id})
    extra = {k: v for k, v in changes.pop("extra", before.extra).items()
             if k not in CLOSE_MARKS}
    opened = before.evolve(version=m.version + 1, valid_from=now, valid_to=None,
                           status=Status.ACTIVE, source=ctx.source(oid), extra=extra, **changes)
    plan.add(PlannedOp(oid, OpKind.UPDATE, m.memory_id, before, opened, (closed, opened), reason),
             count)


def _expire(plan: Plan, ctx: Context, m: Memory, now: float) -> None:
    assert m.expires_at is not None
    _close(plan, ctx, m, Status.DELETED, m.expires_at, now,
           "expired: its time to live passed", "expired")


# --- decay --------------------------------------------------------------------------------

def _slowness(m: Memory, policy: DecayPolicy) -> float:
    """Distilled memories (reflections) and rules of how to act fade slower than raw facts."""
    return policy.slow_factor if is_reflection(m) or m.type == MemoryType.PROCEDURAL else 1.0


def plan_decay(memories: Sequence[Memory], now: float, policy: DecayPolicy,
               ctx: Context) -> Plan:
    """Expire what outlived its TTL, archive what nobody retrieved for ``archive_days``,
    down-weight (once) what nobody retrieved for ``downweight_days``; boundaries count."""
    plan = Plan()
    for i in _eligible(memories, ctx):
        m = memories[i]
        if _expired(m, now):
            _expire(plan, ctx, m, now)
            continue
        idle = now - last_touched(m)
        slow = _slowness(m, policy)
        days = int(idle // DAY)
        if idle >= policy.archive_days * slow * DAY:
            _close(plan, ctx, m, Status.ARCHIVED, now, now,
                   f"archived: no retrieval for {days} days", "archived")
        elif idle >= policy.downweight_days * slow * DAY and decay_weight(m) > policy.weight:
            _revise(plan, ctx, m, now, f"down-weighted: no retrieval for {days} days",
                    "downweighted", extra={**m.extra, "weight": policy.weight, "decayed_at": now})
    return plan


# --- consolidation ------------------------------------------------------------------------

def candidate_from(m: Memory) -> Candidate:
    return Candidate(m.content, m.type, m.importance, slot=m.slot)


def _age(m: Memory) -> tuple[float, float, int, str]:
    """Newest last: ``updated_at`` is when the fact was last asserted (decay keeps it)."""
    return m.updated_at, m.created_at, m.version, m.memory_id


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
    for i in _eligible(memories, ctx):
        if _expired(memories[i], now):
            _expire(plan, ctx, memories[i], now)
        elif not is_reflection(memories[i]):
            pool.append(i)
    pairs = [(cosine(vectors[i], vectors[j]), i, j)
             for a, i in enumerate(pool) for j in pool[a + 1:]]
    pairs = sorted((p for p in pairs if p[0] >= threshold), key=lambda p: (-p[0], p[1], p[2]))
    used: set[int] = set()
    for score, i, j in pairs:
        if i in used or j in used:
            continue
        older, newer = sorted((memories[i], memories[j]), key=_age)
        decision = decide(candidate_from(newer), [(1, older, score)], threshold)
        if decision.op == OpKind.NOOP:
            _merge(plan, ctx, older, newer, now)
        elif decision.op in (OpKind.UPDATE, OpKind.DELETE):
            _close(plan, ctx, older, Status.SUPERSEDED, now, now,
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
    _revise(plan, ctx, older, now, f"merged {newer.memory_id} into it: duplicate", "merged",
            importance=max(older.importance, newer.importance), slot=older.slot or newer.slot,
            updated_at=max(older.updated_at, newer.updated_at), expires_at=expires,
            extra={**older.extra, "merged": merged})
    _close(plan, ctx, newer, Status.SUPERSEDED, now, now,
           f"merged into {older.memory_id}: duplicate", None, merged_into=older.memory_id)


# --- offline reflection -------------------------------------------------------------------

def _item(text: str) -> str:
    """One memory as a clause: one line, no closing stop, lower-case start ("has 3 ...")."""
    text = re.sub(r"\s+", " ", text).strip().rstrip(".。!！;；")
    if len(text) > MAX_ITEM_CHARS:
        text = text[:MAX_ITEM_CHARS - 1].rstrip() + "…"
    if text[:1].isupper() and not text[1:2].isupper():
        text = text[:1].lower() + text[1:]
    return text


def _render(chosen: Sequence[Memory]) -> str:
    facts = [_item(m.content) for m in chosen if m.type != MemoryType.PROCEDURAL]
    rules = [_item(m.content) for m in chosen if m.type == MemoryType.PROCEDURAL]
    parts = [f"{label}: {'; '.join(items)}." for label, items in
             (("Profile", facts), ("Preferences and rules", rules)) if items]
    return " ".join(parts)


def _profile_sources(memories: Sequence[Memory], ctx: Context) -> list[Memory]:
    """The user's durable facts and rules, most important first, one per slot (the newest):
    no reflection, no core block, nothing with a time to live (a budget "this month" is no
    part of a profile), no shared knowledge."""
    by_slot: dict[str, Memory] = {}
    found: list[Memory] = []
    for i in _eligible(memories, ctx):
        m = memories[i]
        if (is_reflection(m) or (m.slot or "").startswith("reflection:")
                or m.expires_at is not None or m.type == MemoryType.SEMANTIC
                or not _item(m.content)):
            continue
        if m.slot is None:
            found.append(m)
        elif m.slot not in by_slot or _age(by_slot[m.slot]) < _age(m):
            by_slot[m.slot] = m
    found += by_slot.values()
    return sorted(found, key=lambda m: (-m.importance, m.slot is None, -m.updated_at,
                                        m.memory_id))


def profile_reflection(memories: Sequence[Memory], existing: Memory | None, now: float,
                       ctx: Context) -> Plan:
    """The rules model's honest, deterministic reflection: a short profile of what the user's
    live memories say, by slot and type, with those memories as its evidence. No insight
    is invented; an LLM reflection is the production path. Nothing to say: no change."""
    plan = Plan()
    chosen: list[Memory] = []
    for m in _profile_sources(memories, ctx):
        if len(_render([*chosen, m])) <= MAX_REFLECTION_CHARS:
            chosen.append(m)
    if not chosen:
        return plan
    text = _render(chosen)
    extra = {"kind": REFLECTION, "evidence": [m.memory_id for m in chosen],
             "method": REFLECTION_METHOD}
    reason = f"reflection: profile of {len(chosen)} memories"
    if existing is None:
        oid = plan.next_id(ctx, OpKind.ADD)
        mid = new_memory_id(oid)
        added = Memory(mid, ctx.tenant_id, ctx.user_id, MemoryType.EPISODIC, text,
                       REFLECTION_IMPORTANCE, now, now, now, ctx.source(oid),
                       slot=REFLECTION_SLOT, extra=extra)
        plan.add(PlannedOp(oid, OpKind.ADD, mid, None, added, (added,), reason), "added")
    elif existing.content != text:
        _revise(plan, ctx, existing, now, reason, "updated", content=text,
                type=MemoryType.EPISODIC, importance=REFLECTION_IMPORTANCE,
                slot=REFLECTION_SLOT, updated_at=now, expires_at=None, extra=extra)
    return plan
