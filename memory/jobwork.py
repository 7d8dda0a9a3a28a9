"""The work of the windowed jobs (SPEC §6), decided like any job of the user.

A ``reflect`` / ``consolidate`` / ``decay`` command (:mod:`jobs.triggers`) reaches the
extract stage as a job of its own kind; here it becomes a :class:`JobOutcome` over the
user's live memories, with the versions it read (so the apply stage fences it like an
extraction job: a memory that moved on since refuses the whole decision and the job runs
again). The plans themselves are pure (:mod:`memory.maintenance`).

Reflection: a model with a reflection step (the OpenAI-compatible one) answers insights
with the numbers of the memories they rest on (Generative Agents: "... (because of 1, 5,
3)"); each becomes a reflection memory with its evidence ids. The offline rules model has
none: the honest deterministic reflection is a profile summary by slot and type
(:func:`memory.maintenance.profile_reflection`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from memstream.memory import maintenance, retrieval, toolwrite
from memstream.memory.decisions import Candidate, Decision, IdMap, PlannedOp, resolve
from memstream.memory.model import Memory, MemoryType, OpKind
from memstream.memory.store import Scope
from memstream.topics.schemas import ExtractionJob, ToolWrite

if TYPE_CHECKING:
    from memstream.memory.extraction import Extractor, Insight, JobOutcome

LINEAGE = {"reflect": "reflection", "consolidate": "consolidation", "decay": "decay"}
CORRECTIONS = {"delete": "deletion", "rollback": "rollback", "undo_job": "rollback",
               "forget": "forget"}
MAX_VERSIONS = 50_000
MAX_LIVE = 10_000


@dataclass(frozen=True)
class JobSettings:
    decay: maintenance.DecayPolicy = field(default_factory=maintenance.DecayPolicy)
    reflection_recent: int = 100


def live_memories(ex: Extractor, job: ExtractionJob) -> list[Memory]:
    found = ex.store.list(Scope(job.tenant_id, job.user_id), limit=MAX_LIVE)
    return [m for m in found if not (m.slot or "").startswith(toolwrite.CORE_PREFIX)]


def insight_ops(insights: list[Insight], shown: list[Memory], ctx: toolwrite.Context,
                ) -> list[PlannedOp]:
    """One reflection memory per insight, its evidence numbers turned back into ids."""
    ops: list[PlannedOp] = []
    for index, insight in enumerate(insights):
        evidence = sorted({shown[n - 1].memory_id for n in insight.evidence})
        cand = Candidate(insight.text, MemoryType.EPISODIC, max(8, insight.importance))
        for op in resolve(cand, index, IdMap(()), Decision(OpKind.ADD, reason="reflection"),
                          ctx):
            after = op.after.evolve(extra={"kind": maintenance.REFLECTION,
                                           "evidence": evidence, "method": "llm"})
            ops.append(replace(op, after=after, writes=(after,)))
    return ops


def _reflect(ex: Extractor, job: ExtractionJob, live: list[Memory], now: float,
             out: JobOutcome) -> maintenance.Plan:
    ctx = toolwrite.tool_context(job, now)
    facts = sorted((m for m in live if not maintenance.is_reflection(m)),
                   key=lambda m: -m.created_at)[:ex.jobs.reflection_recent]
    reflect = getattr(ex.model, "reflect", None)
    if reflect is not None and facts:
        insights, usage = reflect(list(enumerate(facts, start=1)))
        out.usage += usage
        if insights:
            ops = insight_ops(insights, facts, ctx)
            return maintenance.Plan(ops, {m.memory_id: m.version for m in facts})
    current = next((m for m in live if m.slot == maintenance.REFLECTION_SLOT), None)
    return maintenance.profile_reflection(facts, current, now, ctx)


def decide_job(ex: Extractor, job: ExtractionJob, write: ToolWrite, now: float,
               out: JobOutcome) -> JobOutcome:
    """The ops of one windowed job, with the versions they read."""
    live = live_memories(ex, job)
    ctx = toolwrite.tool_context(job, now)
    if write.name == "decay":
        joined = retrieval.join_stats(ex.store, job.tenant_id, job.user_id, live)
        plan = maintenance.plan_decay(joined, now, ex.jobs.decay, ctx)
    elif write.name == "consolidate":
        vectors = ex.embedder.embed([m.content for m in live]) if live else []

        def decide(c: Candidate, shown: list[tuple[int, Memory, float]],
                   threshold: float) -> Decision:
            decision, usage = ex.model.decide(c, shown, threshold)
            out.usage += usage
            return decision

        plan = maintenance.plan_consolidation(live, vectors, ex.embedder.same_threshold,
                                              decide, now, ctx)
    else:
        plan = _reflect(ex, job, live, now, out)
    opened = [op for op in plan.ops if op.kind != OpKind.DELETE]
    fresh = iter(ex.embedder.embed([op.after.content for op in opened]) if opened else [])
    out.ops = [(op, None if op.kind == OpKind.DELETE else next(fresh)) for op in plan.ops]
    out.read = dict(plan.read)
    out.decisions.update(plan.counts)
    return out


def decide_correction(ex: Extractor, job: ExtractionJob, write: ToolWrite, now: float,
                      out: JobOutcome) -> JobOutcome:
    """A delete / rollback / undo of the user or an operator (:mod:`memory.governance`)."""
    from memstream.memory import governance

    ctx = toolwrite.tool_context(job, now)
    versions = ex.store.list(Scope(job.tenant_id, job.user_id), statuses=None,
                             limit=MAX_VERSIONS)
    by = "an operator" if write.principal in ("admin", "") else "the user"
    if write.name == "forget":  # erase everything of the user (apply: store.erase)
        out.erase = sum(1 for m in versions if m.user_id == job.user_id)
        out.decisions["erased"] = out.erase
        return out
    if write.name == "delete":
        ids = None if write.all_memories else [write.target_id]
        found = governance.plan_delete(versions, ids, ctx,
                                       write.reason or f"deleted by {by}")
    elif write.name == "rollback":
        found = governance.plan_rollback(versions, write.target_id, write.version, ctx)
    else:
        found = governance.plan_undo_job(versions, write.target_id, ctx)
    plan = found.plan
    opened = [op for op in plan.ops if op.kind != OpKind.DELETE]
    fresh = iter(ex.embedder.embed([op.after.content for op in opened]) if opened else [])
    out.ops = [(op, None if op.kind == OpKind.DELETE else next(fresh)) for op in plan.ops]
    out.read = dict(plan.read)
    out.decisions.update(plan.counts)
    if found.refused and not plan.ops:
        out.error = "; ".join(found.refused)[:500]
    return out
