"""What a job decides when it is not an extraction: a :class:`Plan` of planned ops, and the
primitives that close and revise versions. The windowed jobs (:mod:`jobs.decay`,
:mod:`jobs.consolidation`, :mod:`jobs.reflection`) and the corrections
(:mod:`memory.governance`) build their plans from these.

A plan holds ops of the same shapes as :func:`memory.decisions.resolve`, so every job goes
through the same decide -> apply path as extraction (change events with lineage, fenced by
the versions in ``Plan.read``, rebuildable from the memory-change topic). No store, no I/O,
no clock.

- Closing a version is a DELETE-kind op whatever the status it leaves (deleted, archived,
  superseded): the memory is no longer live. Changing a memory is an UPDATE-kind op: the old
  version closed (superseded), ``version + 1`` opened.
- A revised version keeps ``updated_at`` unless told otherwise: it is the time the fact was
  last asserted, which decay measures idleness from; the time of the change is
  ``valid_from``.
- Version records never carry hit statistics (they live beside them, :mod:`memory.access_stats`):
  the joined ``last_accessed_at`` / ``access_count`` are dropped from every record written.
- Core-memory blocks (slot ``core:*``) are the agent's own: never touched by a plan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memstream.memory.decisions import Context, PlannedOp, op_id
from memstream.memory.embedding import Embedder
from memstream.memory.model import Memory, OpKind, Status
from memstream.memory.outcome import JobOutcome
from memstream.memory.toolwrite import CORE_PREFIX

# on a closed version: which op and job closed it, why, of what kind, who asked
CLOSE_MARKS = ("closed_by", "closed_job", "closed_reason", "closed_kind", "closed_actor",
               "closed_ts")
REFLECTION = "reflection"  # extra["kind"] of a reflection memory


def is_reflection(m: Memory) -> bool:
    return m.extra.get("kind") == REFLECTION


@dataclass
class Plan:
    """What one maintenance job changes, and the versions it read (checked at apply time)."""

    ops: list[PlannedOp] = field(default_factory=list)
    read: dict[str, int] = field(default_factory=dict)  # memory id -> version read
    counts: Counter[str] = field(default_factory=Counter)

    def next_id(self, ctx: Context, kind: OpKind) -> str:
        """The id of the op added next (the index is its position: unique in the plan)."""
        return op_id(ctx.job_id, len(self.ops), kind, ctx.seq)

    def into(self, out: JobOutcome, embedder: Embedder) -> JobOutcome:
        """The plan as the job's outcome: its ops, each version it opens embedded (a closed
        one carries no vector), the versions it read and its counts."""
        opened = [op for op in self.ops if op.kind != OpKind.DELETE]
        fresh = iter(embedder.embed([op.after.content for op in opened]) if opened else [])
        out.ops = [(op, None if op.kind == OpKind.DELETE else next(fresh)) for op in self.ops]
        out.read = dict(self.read)
        out.decisions.update(self.counts)
        return out

    def add(self, op: PlannedOp, count: str | None) -> None:
        self.ops.append(op)
        if op.before is not None:
            self.read[op.memory_id] = op.before.version
        if count:
            self.counts[count] += 1


def eligible(memories: Sequence[Memory], ctx: Context) -> list[int]:
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


def bare(m: Memory) -> Memory:
    return m.evolve(last_accessed_at=None, access_count=0)


def expired(m: Memory, now: float) -> bool:
    return m.expires_at is not None and m.expires_at <= now


def close(plan: Plan, ctx: Context, m: Memory, status: Status, valid_to: float, now: float,
           reason: str, count: str | None, **marks: Any) -> None:
    """A DELETE-kind op: the live version closed with ``status`` (content kept)."""
    oid = plan.next_id(ctx, OpKind.DELETE)
    before = bare(m)
    closed = before.evolve(status=status, valid_to=valid_to, updated_at=now,
                           extra={**before.extra, **marks, "closed_by": oid,
                                  "closed_job": ctx.job_id})
    plan.add(PlannedOp(oid, OpKind.DELETE, m.memory_id, before, closed, (closed,), reason), count)


def revise(plan: Plan, ctx: Context, m: Memory, now: float, reason: str, count: str | None,
            **changes: Any) -> None:
    """An UPDATE-kind op: the live version superseded, ``version + 1`` opened with
    ``changes`` (``updated_at`` is kept unless changed: see the module docstring)."""
    oid = plan.next_id(ctx, OpKind.UPDATE)
    before = bare(m)
    closed = before.evolve(status=Status.SUPERSEDED, valid_to=now, updated_at=now,
                           extra={**before.extra, "closed_by": oid, "closed_job": ctx.job_id})
    extra = {k: v for k, v in changes.pop("extra", before.extra).items()
             if k not in CLOSE_MARKS}
    opened = before.evolve(version=m.version + 1, valid_from=now, valid_to=None,
                           status=Status.ACTIVE, source=ctx.source(oid), extra=extra, **changes)
    plan.add(PlannedOp(oid, OpKind.UPDATE, m.memory_id, before, opened, (closed, opened), reason),
             count)


def expire(plan: Plan, ctx: Context, m: Memory, now: float) -> None:
    assert m.expires_at is not None
    close(plan, ctx, m, Status.DELETED, m.expires_at, now,
           "expired: its time to live passed", "expired")


def age(m: Memory) -> tuple[float, float, int, str]:
    """Newest last: ``updated_at`` is when the fact was last asserted (decay keeps it)."""
    return m.updated_at, m.created_at, m.version, m.memory_id
