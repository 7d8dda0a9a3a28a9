"""A user's or an operator's corrections (SPEC §4, §7) as pure planners: delete, rollback,
undo a job.

They are jobs of the user like any other (``ToolWrite`` names ``delete`` / ``rollback`` /
``undo_job``): queued by the ingest stage, decided here into a :class:`memory.plan.Plan`,
fenced by the versions it read and applied by the apply stage, so each correction is a
change event with lineage (``kind`` deletion / rollback, ``actor`` the key that asked) and
a rebuild from the memory-change topic replays it. No store, no I/O, no clock.

- **delete**: the live version is closed with status ``deleted`` (soft: no longer
  retrievable, kept for the history until a forget-me erases it); one memory or all of
  the user's (core blocks included: "delete everything" means everything).
- **rollback** to version *v*: a new version equal to *v* (content, type, importance,
  slot, expiry); the versions between stay in the history. A memory that is no longer
  live (deleted, archived) is restored: a new live version, an ADD-kind op on the same id.
- **undo_job**: every change of one job, each undone against the memory's current state:
  an ADD is deleted, an UPDATE rolled back to the version before it, a version the job
  closed (deleted, merged away, archived) restored. A memory changed again since the job
  is left alone and reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from memstream.memory.decisions import Context, PlannedOp
from memstream.memory.embedding import Embedder
from memstream.memory.model import Memory, OpKind, Status
from memstream.memory.outcome import JobOutcome
from memstream.memory.plan import CLOSE_MARKS, Plan, bare
from memstream.memory.plan import close as maintenance_close
from memstream.memory.store import MemoryStore, Scope
from memstream.memory.toolwrite import tool_context
from memstream.topics.schemas import ExtractionJob, ToolWrite

MAX_VERSIONS = 50_000  # a correction reads at most this many versions of the user


@dataclass
class Outcome:
    """A plan, and what could not be done (a refusal is an answer, not an error)."""

    plan: Plan = field(default_factory=Plan)
    refused: list[str] = field(default_factory=list)


def _latest(versions: Sequence[Memory]) -> Memory | None:
    return max(versions, key=lambda m: m.version, default=None)


def _live(versions: Sequence[Memory]) -> Memory | None:
    live = [m for m in versions if m.live]
    return _latest(live)


def _by_id(memories: Sequence[Memory], ctx: Context) -> dict[str, list[Memory]]:
    out: dict[str, list[Memory]] = {}
    for m in memories:
        if (m.tenant_id, m.user_id) == (ctx.tenant_id, ctx.user_id):  # never another's
            out.setdefault(m.memory_id, []).append(m)
    return out


def _close(plan: Plan, ctx: Context, m: Memory, reason: str) -> None:
    maintenance_close(plan, ctx, m, Status.DELETED, ctx.now, ctx.now, reason, "deleted")


def _become(plan: Plan, ctx: Context, versions: Sequence[Memory], target: Memory,
            reason: str) -> None:
    """A new version of ``target.memory_id`` equal to ``target``: an UPDATE of the live
    version, or (nothing live) an ADD-kind op reopening the memory."""
    live = _live(versions)
    latest = _latest(versions)
    assert latest is not None
    extra = {k: v for k, v in target.extra.items() if k not in CLOSE_MARKS}
    if live is not None:
        oid = plan.next_id(ctx, OpKind.UPDATE)
        before = bare(live)
        closed = before.evolve(status=Status.SUPERSEDED, valid_to=ctx.now, updated_at=ctx.now,
                               extra={**before.extra, "closed_by": oid,
                                      "closed_job": ctx.job_id})
    else:
        oid = plan.next_id(ctx, OpKind.ADD)
        before, closed = None, None
    opened = bare(target).evolve(
        version=latest.version + 1, valid_from=ctx.now, valid_to=None, updated_at=ctx.now,
        status=Status.ACTIVE, source=ctx.source(oid), extra=extra)
    if before is None:
        plan.add(PlannedOp(oid, OpKind.ADD, target.memory_id, None, opened, (opened,), reason),
                 "restored")
        return
    assert closed is not None
    plan.add(PlannedOp(oid, OpKind.UPDATE, target.memory_id, before, opened, (closed, opened),
                       reason), "rolled_back")


def plan_delete(memories: Sequence[Memory], memory_ids: Sequence[str] | None, ctx: Context,
                reason: str = "deleted by the user") -> Outcome:
    """Close the live version of each of ``memory_ids`` (None: every live memory)."""
    out = Outcome()
    groups = _by_id(memories, ctx)
    wanted = sorted(groups) if memory_ids is None else list(dict.fromkeys(memory_ids))
    for memory_id in wanted:
        live = _live(groups.get(memory_id, []))
        if live is None:
            if memory_ids is not None:
                out.refused.append(f"{memory_id}: no live memory with this id")
            continue
        _close(out.plan, ctx, live, reason)
    return out


def plan_rollback(versions: Sequence[Memory], memory_id: str, version: int,
                  ctx: Context) -> Outcome:
    """A new version of ``memory_id`` equal to its ``version``."""
    out = Outcome()
    mine = _by_id(versions, ctx).get(memory_id, [])
    target = next((m for m in mine if m.version == version), None)
    if target is None:
        out.refused.append(f"{memory_id}: no version {version}")
        return out
    live = _live(mine)
    if live is not None and live.version == version:
        out.refused.append(f"{memory_id}: version {version} is the live one already")
        return out
    if live is not None and (live.content, live.importance, live.type, live.slot) == (
            target.content, target.importance, target.type, target.slot):
        out.refused.append(f"{memory_id}: the live version already says the same")
        return out
    _become(out.plan, ctx, mine, target, f"rollback to version {version}")
    return out


def plan_undo_job(memories: Sequence[Memory], job_id: str, ctx: Context) -> Outcome:
    """Undo what job ``job_id`` did to each memory, if nothing changed it since."""
    out = Outcome()
    short = job_id[:12]
    for memory_id, mine in sorted(_by_id(memories, ctx).items()):
        made = [m for m in mine if m.source.job_id == job_id]  # versions the job opened
        # versions the job closed without opening one of the same memory: deleted,
        # merged away (superseded) by a consolidation, archived by a decay
        deleted = [m for m in mine if not m.live and m.extra.get("closed_job") == job_id]
        if not made and not deleted:
            continue
        latest = _latest(mine)
        assert latest is not None
        touched = max(m.version for m in made or deleted)
        if latest.version != touched or (made and not latest.live and not deleted):
            out.refused.append(f"{memory_id}: changed again after job {short}")
            continue
        if not made:  # the job deleted it: restore
            _become(out.plan, ctx, mine, latest, f"undo of job {short}: restored")
            continue
        first = min(made, key=lambda m: m.version)
        prior = next((m for m in mine if m.version == first.version - 1), None)
        if prior is None:  # the job added it
            if latest.live:
                _close(out.plan, ctx, latest, f"undo of job {short}: added by it")
        elif prior.extra.get("closed_job") != job_id:
            # closed before the job (a rollback of a deleted memory restored it): closed
            # again, not brought back as it was
            if latest.live:
                _close(out.plan, ctx, latest, f"undo of job {short}: closed again as before")
        else:
            _become(out.plan, ctx, mine, prior,
                    f"undo of job {short}: back to version {prior.version}")
    return out


def decide_correction(store: MemoryStore, embedder: Embedder, job: ExtractionJob,
                      write: ToolWrite, now: float, out: JobOutcome) -> JobOutcome:
    """A delete / rollback / undo / forget of the user or an operator, decided into ops
    (with the versions they read) like any job of the user."""
    ctx = tool_context(job, now)
    versions = store.list(Scope(job.tenant_id, job.user_id), statuses=None,
                             limit=MAX_VERSIONS)
    by = "an operator" if write.principal in ("admin", "") else "the user"
    if write.name == "forget":  # erase everything of the user (apply: store.erase)
        out.erase = sum(1 for m in versions if m.user_id == job.user_id)
        out.decisions["erased"] = out.erase
        return out
    if write.name == "delete":
        ids = None if write.all_memories else [write.target_id]
        found = plan_delete(versions, ids, ctx, write.reason or f"deleted by {by}")
    elif write.name == "rollback":
        found = plan_rollback(versions, write.target_id, write.version, ctx)
    else:
        found = plan_undo_job(versions, write.target_id, ctx)
    found.plan.into(out, embedder)
    if found.refused and not found.plan.ops:
        out.error = "; ".join(found.refused)[:500]
    return out
