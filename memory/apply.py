"""Applying memory changes to the store, idempotently (SPEC §4, §9).

The same function serves the live pipeline and a rebuild: replaying the memory-change
topic in order into an empty store produces the same records, with no LLM call.
"""

from __future__ import annotations

from datetime import UTC, datetime

from memstream.memory.decisions import PlannedOp
from memstream.memory.extraction import JobOutcome, MemoryModel
from memstream.memory.model import Memory
from memstream.memory.store import MemoryStore, Scope
from memstream.topics.schemas import ExtractionJob, Lineage, MemoryChange


def change_for(op: PlannedOp, vector: list[float] | None, job: ExtractionJob,
               outcome: JobOutcome, model: MemoryModel, now: float) -> MemoryChange:
    return MemoryChange(
        change_id=op.op_id, op=op.kind.value, tenant_id=job.tenant_id, user_id=job.user_id,
        memory_id=op.memory_id, version=op.after.version,
        before=op.before.to_payload() if op.before else None, after=op.after.to_payload(),
        records=[r.to_payload() for r in op.writes], vector=vector, reason=op.reason,
        lineage=Lineage(session_id=job.session_id, from_seq=job.from_seq, to_seq=job.to_seq,
                        job_id=job.job_id, message_ids=[m.message_id for m in job.messages]),
        model=model.name, prompt_version=model.prompt_version,
        prompt_tokens=outcome.usage.prompt_tokens,
        completion_tokens=outcome.usage.completion_tokens,
        decided_at=datetime.fromtimestamp(now, UTC),
    )


def apply_change(store: MemoryStore, change: MemoryChange) -> bool:
    """Write the change's records unless it was applied before; True if written now."""
    scope = Scope(change.tenant_id, change.user_id)
    if store.op_applied(scope, change.change_id):
        return False
    records = [Memory.from_payload(r) for r in change.records]
    for r in records:
        if (r.tenant_id, r.user_id) != (change.tenant_id, change.user_id):
            raise ValueError(f"change {change.change_id} writes outside its user's scope")
    vectors = [change.vector if r.source.op_id == change.change_id else None for r in records]
    store.write(records, vectors)
    return True
