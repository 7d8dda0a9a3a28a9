"""The public memory event of a change event: what the apply stage publishes on
``<prefix>.memory-events``. The event's models are the wire contract's
(:mod:`memstream.contract.events`, read downstream by :mod:`memstream.consumer`); which
changes are public and how one becomes its event is the server's. Pure: no I/O.
"""

from __future__ import annotations

from memstream.contract.events import EventLineage, MemoryEvent, MemoryState
from memstream.topics.schemas import MemoryChange

# changelog ops that are no public event (is_public)
PRIVATE_OPS = frozenset({"restate", "archive"})


def is_public(change: MemoryChange) -> bool:
    """Whether ``change`` is an event downstream sees. A restatement is not: it changes
    nothing a reader sees but a later version's ``stated_time`` (the memory-change topic
    carries it for rebuilds), and the v1 contract's ops are closed."""
    return change.op not in PRIVATE_OPS


def public_event(change: MemoryChange) -> MemoryEvent:
    """The public event of a change event (plain, before any sealing)."""
    erase = change.op == "erase"
    lin = change.lineage
    return MemoryEvent(
        change_id=change.change_id, op=change.op, tenant_id=change.tenant_id,
        user_id=change.user_id, memory_id=change.memory_id, version=change.version,
        before=MemoryState.of(change.before), after=MemoryState.of(change.after),
        reason="forget-me" if erase else change.reason,  # the request's words stay in
        # the audit (memory-changes): downstream learns that, not why
        lineage=EventLineage(kind=lin.kind, session_id=lin.session_id,
                             from_seq=lin.from_seq, to_seq=lin.to_seq,
                             message_ids=list(lin.message_ids), job_id=lin.job_id,
                             job_seq=lin.seq, actor=lin.actor),
        model=change.model, prompt_version=change.prompt_version,
        decided_at=change.decided_at,
        erased_versions=int(change.after.get("version_records", 0)) if erase else None,
    )
