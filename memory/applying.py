"""Applying decided changes to the store, fenced and idempotent (SPEC §4, §9).

- :func:`apply_decision` is the live path: the fencing verdict of :mod:`memory.fencing`
  decides whether a decision is applied, re-published or refused; a decision whose read
  memories moved on is refused whole (nothing written); otherwise every record is written
  and the user's cursor moves to the job, after its changes, with the job's change events
  kept beside it. Whichever decision of that job comes again, those kept events, and only
  those, are published again: the store never holds a change the topic may lack.
- :func:`apply_change` is the replay path: replaying the memory-change topic in order into
  an empty store rebuilds the same records, with no LLM call; a change seen before is
  skipped, and the cursor follows the job numbers the changes carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from memstream.memory import fencing
from memstream.memory.archive import ARCHIVE_OP, turn_point_id
from memstream.memory.decisions import PlannedOp, op_id
from memstream.memory.extraction import JobOutcome, MemoryModel
from memstream.memory.fencing import Cursor, Touch, Verdict, moved_on, verdict
from memstream.memory.model import Memory, OpKind
from memstream.memory.store import MemoryStore, Scope
from memstream.memory.toolwrite import CORRECTIONS, LINEAGE
from memstream.topics.schemas import (
    WIRE,
    ExtractionJob,
    JobDecision,
    JobRange,
    JobStatus,
    Lineage,
    MemoryChange,
)


def _message_ids(job: ExtractionJob) -> list[str]:
    if job.tool is not None:  # the model's tool call id (else the request's)
        return [i for i in (job.tool.call_id or job.tool.request_id,) if i]
    return [m.message_id for m in job.messages]


def _lineage_kind(job: ExtractionJob) -> str:
    if job.tool is None:
        return "extraction"
    # a windowed job's, a correction's, or an agent's tool call
    return LINEAGE.get(job.tool.name) or CORRECTIONS.get(job.tool.name, "tool")


def _prompt_version(job: ExtractionJob, model: MemoryModel) -> str:
    """The prompt that decided: a reflection job's is the model's reflection prompt."""
    if job.tool is not None and job.tool.name == "reflect":
        return str(getattr(model, "reflect_prompt_version", model.prompt_version))
    return model.prompt_version


def _stamped(record: Memory, op: PlannedOp, kind: str, actor: str,
             trigger: str = "", seq: int = 0) -> dict[str, object]:
    """A version record with why it exists (the version an op opens) or why it was closed
    (the version a DELETE-kind op closes): reason, lineage kind, actor, what triggered the
    job (threshold, explicit, session_end, idle, tool) and, for the version it opens, the
    job's seq (:attr:`Memory.job_seq`). No content."""
    payload = record.to_payload()
    marks: dict[str, object]
    if record.source.op_id == op.op_id:
        marks = {"reason": op.reason, "lineage_kind": kind, "actor": actor, "trigger": trigger}
        if seq:
            marks["job_seq"] = seq
        elif "job_seq" in record.extra:  # never the seq of the version it was made from
            payload["extra"] = {k: v for k, v in record.extra.items() if k != "job_seq"}
    elif record.extra.get("closed_by") == op.op_id and op.kind == OpKind.DELETE:
        marks = {"closed_reason": op.reason, "closed_kind": kind, "closed_actor": actor}
    else:
        return payload
    payload["extra"] = {**dict(payload.get("extra") or {}), **marks}
    return payload


def change_for(op: PlannedOp, vector: list[float] | None, job: ExtractionJob,
               outcome: JobOutcome, model: MemoryModel, now: float) -> MemoryChange:
    """The change event of one op. ``vector`` (the embedder's) is kept as float32 values
    (``MemoryChange.vector``): what the topic carries, what the store keeps, and what a
    rebuild writes, so the live and rebuilt stores hold the same vector."""
    kind = _lineage_kind(job)
    actor = job.tool.principal if job.tool else ""
    return MemoryChange(
        change_id=op.op_id, op=op.kind.value, tenant_id=job.tenant_id, user_id=job.user_id,
        memory_id=op.memory_id, version=op.after.version,
        before=op.before.to_payload() if op.before else None, after=op.after.to_payload(),
        records=[_stamped(r, op, kind, actor, job.reason.value, job.seq) for r in op.writes],
        vector=vector,
        reason=op.reason,
        lineage=Lineage(session_id=job.session_id, from_seq=job.from_seq, to_seq=job.to_seq,
                        job_id=job.job_id, message_ids=_message_ids(job),
                        seq=job.seq, kind=kind, actor=actor),
        model=model.name, prompt_version=_prompt_version(job, model),
        prompt_tokens=outcome.usage.prompt_tokens,
        completion_tokens=outcome.usage.completion_tokens,
        decided_at=datetime.fromtimestamp(now, UTC),
    )


def erase_change(job: ExtractionJob, versions: int, model: MemoryModel,
                 now: float) -> MemoryChange:
    """The audit record of a forget-me: who asked, when, how many version records; never
    content (not even the reason the request gave: it stays in the request, retention-bound).
    Replayed, it erases the user from the rebuilt store."""
    assert job.tool is not None
    return MemoryChange(
        change_id=op_id(job.job_id, 0, OpKind.DELETE, job.seq), op="erase",
        tenant_id=job.tenant_id, user_id=job.user_id, memory_id="*", version=0, before=None,
        after={"version_records": versions}, records=[], vector=None,
        reason="forget-me",  # the request's words may be content: this record is plain
        lineage=Lineage(session_id=job.session_id, from_seq=0, to_seq=0, job_id=job.job_id,
                        message_ids=_message_ids(job), seq=job.seq, kind="forget",
                        actor=job.tool.principal),
        model=model.name, prompt_version="-", decided_at=datetime.fromtimestamp(now, UTC))


def build_decision(job: ExtractionJob, out: JobOutcome, model: MemoryModel,
                   now: float, archived: Sequence[MemoryChange] = ()) -> JobDecision:
    """The decision record of one decided job: its changes, the versions it read, its id
    (no wall clock in it: the same job decided to the same ops at another time has the
    same id; the changes keep ``decided_at``). ``archived``: the job's turns for the
    episodic archive (:mod:`memory.archive`), after its memories' changes."""
    status = JobStatus.TRIVIAL if out.trivial else JobStatus.DONE
    changes = [change_for(op, vec, job, out, model, now) for op, vec in out.ops]
    if out.erase is not None:
        changes.append(erase_change(job, out.erase, model, now))
    changes += archived
    return JobDecision(
        **JobRange.fields_of(job), status=status,
        decision_id=fencing.decision_id(
            # the changes in their wire form: a vector is one packed string, not 512
            # floats to walk and print (most of a decision's cost before)
            [job.job_id, job.seq, status.value,
             [c.model_dump(mode="json", context=WIRE) for c in changes]]),
        read_versions=dict(out.read), read_pending=sorted(out.pending), changes=changes,
        decisions=dict(out.decisions), llm_calls=out.usage.calls,
        prompt_tokens=out.usage.prompt_tokens, completion_tokens=out.usage.completion_tokens,
        model=model.name, prompt_version=model.prompt_version, error=out.error,
    )


def _write(store: MemoryStore, change: MemoryChange) -> None:
    """Write every record of the change (deterministic point ids: rewriting is harmless)."""
    if change.op == ARCHIVE_OP:  # an archived turn: one record, not a memory
        _write_turns(store, [change])
        return
    records = [Memory.from_payload(r) for r in change.records]
    for r in records:
        if (r.tenant_id, r.user_id) != (change.tenant_id, change.user_id):
            raise ValueError(f"change {change.change_id} writes outside its user's scope")
    # The new version first, the closing of the old one last: a crash in between leaves the
    # change visibly half-done (two live versions), which the re-apply completes.
    order = sorted(range(len(records)), key=lambda i: records[i].source.op_id != change.change_id)
    store.write([records[i] for i in order],
                [change.vector if records[i].source.op_id == change.change_id else None
                 for i in order])


def _write_turns(store: MemoryStore, changes: Sequence[MemoryChange]) -> None:
    """The turn records of ``archive`` changes, in one write (each scope-checked)."""
    turns = []
    for change in changes:
        for r in change.records:
            if (r.get("tenant_id"), r.get("user_id")) != (change.tenant_id, change.user_id):
                raise ValueError(f"change {change.change_id} writes outside its user's scope")
            turns.append((turn_point_id(str(r["memory_id"])), r, change.vector))
    store.write_records(turns)


def apply_change(store: MemoryStore, change: MemoryChange) -> bool:
    """Replay one change unless it was applied before; True if written now."""
    scope = Scope(change.tenant_id, change.user_id)
    seq = change.lineage.seq
    if seq:
        cursor = store.cursor(scope)
        if cursor is not None and seq < cursor.seq:
            # The store is past this job: its changes are there, or were erased since
            # (a forget-me), which a replay must never undo. (The cursor's own job may
            # be half-applied: its changes are checked one by one below.)
            return False
    if change.op == "erase":
        store.erase(scope)
    elif store.op_applied(scope, change.change_id):
        return False
    else:
        _write(store, change)
    if seq:
        cursor = store.cursor(scope)
        if cursor is None or cursor.seq < seq:
            store.set_cursor(scope, Cursor(seq, change.lineage.job_id))
    return True


def _touch(change: MemoryChange) -> Touch:
    """A late fact kept as history (an ADD superseded from the start) leaves no live
    version, like a DELETE: once written, its memory is not live, and that is not a move."""
    before = change.before["version"] if change.before else None
    live = change.op != "delete" and change.after.get("status", "active") == "active"
    return Touch(change.change_id, change.memory_id, before, change.version if live else None)


@dataclass(frozen=True)
class Applied:
    """What applying one decision did, and what the apply stage must send."""

    verdict: Verdict
    status: JobStatus  # the status of the job result to send
    publish: list[MemoryChange] = field(default_factory=list)  # change events to (re)publish
    applied_seq: int | None = None  # for a FENCED result: the store's cursor
    error: str | None = None


def kept_changes(store: MemoryStore, scope: Scope, cursor: Cursor | None) -> list[MemoryChange]:
    """The change events the cursor's job published, as the store kept them (byte for byte:
    one change id, one payload)."""
    kept = fencing.republished(cursor, store.published(scope))
    return [MemoryChange.model_validate_json(text) for text in kept]


def _marks(op_id: str, records: list[Memory]) -> set[tuple[object, ...]]:
    """What op ``op_id`` fixed in these records, which no later op changes: the versions it
    opened, closed or restated."""
    out: set[tuple[object, ...]] = set()
    for m in records:
        if m.source.op_id == op_id:
            out.add(("opened", m.memory_id, m.version, m.content, m.created_at, m.valid_from,
                     m.source))
        if m.extra.get("closed_by") == op_id:
            out.add(("closed", m.memory_id, m.version, m.valid_to))
        if m.extra.get("restated_by") == op_id:
            out.add(("restated", m.memory_id, m.version, m.extra.get("restated_ts")))
    return out


def overtaken_writes(store: MemoryStore, scope: Scope, decision: JobDecision,
                     published: set[str]) -> list[MemoryChange]:
    """The changes of ``decision`` (another decision of the cursor's job) whose records the
    store holds although the cursor's decision did not publish them: this decision was
    half-applied (killed between its writes) and then overtaken by another decision of
    its job, decided against the half-applied store. Their records have no event unless
    this decision publishes them now, with its own payloads: only changes whose records
    in the store are this decision's (the same opening, or the same close) are."""
    unpublished = [c for c in decision.changes
                   if c.op != "erase" and c.change_id not in published]
    applied = store.ops_applied(scope, [c.change_id for c in unpublished])
    orphans = [c for c in unpublished if c.change_id in applied]
    turns = [c for c in orphans if c.op == ARCHIVE_OP]  # a turn's record is its message's
    orphans = [c for c in orphans if c.op != ARCHIVE_OP]
    if not orphans:
        return turns
    held = store.list(scope, statuses=None)
    return [c for c in orphans if _marks(c.change_id, held) == _marks(
        c.change_id, [Memory.from_payload(r) for r in c.records])] + turns


def apply_decision(store: MemoryStore, decision: JobDecision) -> Applied:
    """Apply one decision exactly once, in job order (see :mod:`memory.fencing`)."""
    scope = Scope(decision.tenant_id, decision.user_id)
    cursor = store.cursor(scope)
    found = verdict(cursor, decision.seq, decision.job_id, decision.decision_id)
    if found == Verdict.FENCED:
        held = cursor.seq if cursor else 0
        return Applied(found, JobStatus.FENCED, applied_seq=held,
                       error=f"job {decision.seq} fenced: the store holds job {held}")
    if found in (Verdict.DONE, Verdict.REPUBLISH):  # the job is in the store: its events
        status = decision.status if found == Verdict.REPUBLISH else JobStatus.DONE
        kept = kept_changes(store, scope, cursor)
        if found == Verdict.DONE:
            kept += overtaken_writes(store, scope, decision, {c.change_id for c in kept})
        return Applied(found, status, kept)
    if decision.status in (JobStatus.FAILED, JobStatus.FENCED):
        return Applied(found, decision.status, applied_seq=decision.applied_seq,
                       error=decision.error)
    if decision.read_pending:  # what it read is not applied yet: that decision goes first
        held = cursor.seq if cursor else 0
        return Applied(Verdict.FENCED, JobStatus.FENCED, applied_seq=held,
                       error=f"memory {decision.read_pending[0]} read as another decision of "
                             f"job {decision.seq} left it, before that decision was applied")
    changes = decision.changes
    memories = [c for c in changes if c.op != ARCHIVE_OP]  # turns read and move nothing
    applied = store.ops_applied(scope, [c.change_id for c in memories])
    touched = set(decision.read_versions) | {c.memory_id for c in memories}
    live = store.live_versions(scope, sorted(touched))
    stale = moved_on(decision.read_versions, live, map(_touch, memories), applied)
    if stale is not None:
        held = cursor.seq if cursor else 0
        return Applied(Verdict.FENCED, JobStatus.FENCED, applied_seq=held,
                       error=f"memory {stale} moved on since the decision read it")
    for change in memories:
        if change.op == "erase":
            store.erase(scope)
        else:
            _write(store, change)
    turns = [c for c in changes if c.op == ARCHIVE_OP]
    if turns:  # the job's turns in one write
        _write_turns(store, turns)
    if decision.seq:  # the events to publish, kept with the cursor for a re-publication
        # in their wire form (vectors packed); parsed back, they dump to the same bytes
        store.set_cursor(scope, Cursor(decision.seq, decision.job_id, decision.decision_id),
                         [c.dumps().decode() for c in changes])
    return Applied(found, decision.status, list(changes))
