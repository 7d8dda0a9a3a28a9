"""Deciding an agent's memory write (a job of kind ``tool``), on the extraction path.

An agent's ``memory_insert`` / ``core_memory_replace`` (SPEC §5, MemGPT style) is not
written around the pipeline: the ingest stage queues it as a job of the user (serialised
with extraction jobs, fenced by the same per-user seq), and here it is decided like a
candidate fact, into the same :class:`JobOutcome` the apply stage applies:

- ``memory_insert``: the content is a candidate; the configured decision maker (rules or
  LLM) sees the user's most similar memories and answers ADD / UPDATE / NOOP, so an agent
  inserting what is already known does not create a duplicate.
- ``core_memory_replace``: core memory is one small memory per label (slot
  ``core:<label>``); the new text is computed from the live block (:func:`replace_core`)
  and becomes an UPDATE of it, or an ADD when the block does not exist yet. A replace
  whose ``old_content`` is no longer in the block (another write came first) changes
  nothing and reports why.
"""

from __future__ import annotations

from memstream.memory.decisions import Candidate, Context, Decision, IdMap, PlannedOp, resolve
from memstream.memory.model import MemoryType, OpKind
from memstream.memory.store import MemoryStore, Scope
from memstream.memory.tools import CORE_LABELS, ToolError, replace_core
from memstream.topics.schemas import ExtractionJob, ToolWrite

CORE_IMPORTANCE = 8
# The lineage kind of what each other job of kind ``tool`` writes: the windowed jobs
# (:mod:`jobs.work`) and the corrections (:mod:`memory.governance`).
LINEAGE = {"reflect": "reflection", "consolidate": "consolidation", "decay": "decay"}
CORRECTIONS = {"delete": "deletion", "rollback": "rollback", "undo_job": "rollback",
               "forget": "forget"}


CORE_PREFIX = "core:"


def core_slot(label: str) -> str:
    return f"{CORE_PREFIX}{label}"


CORE_SLOTS = tuple(core_slot(label) for label in CORE_LABELS)


def tool_context(job: ExtractionJob, now: float) -> Context:
    request = (job.tool.call_id or job.tool.request_id) if job.tool else ""
    request = request or job.job_id
    return Context(job.tenant_id, job.user_id, job.session_id, job.from_seq, job.to_seq,
                   job.job_id, now, (request,), job.seq)


def core_ops(store: MemoryStore, job: ExtractionJob, write: ToolWrite, now: float,
             ) -> tuple[list[PlannedOp], dict[str, int], str | None]:
    """(planned ops, versions read, error) of a ``core_memory_replace``."""
    if write.label not in CORE_LABELS:
        return [], {}, f"unknown core memory label {write.label!r}"
    scope = Scope(job.tenant_id, job.user_id)
    live = store.list(scope, slots=[core_slot(write.label)], limit=4)
    current = max(live, key=lambda m: m.version, default=None)
    try:
        text = replace_core(current.content if current else "", write.old_content,
                            write.content)
    except ToolError as exc:
        return [], ({current.memory_id: current.version} if current else {}), str(exc)
    cand = Candidate(text, MemoryType.EPISODIC, CORE_IMPORTANCE, slot=core_slot(write.label))
    ctx = tool_context(job, now)
    if current is None:
        return resolve(cand, 0, IdMap(()), Decision(OpKind.ADD, reason="core memory set"),
                       ctx), {}, None
    if current.content == text:
        return [], {current.memory_id: current.version}, None
    shown = IdMap((current,))
    ops = resolve(cand, 0, shown, Decision(OpKind.UPDATE, 1, "core memory replaced"), ctx)
    return ops, {current.memory_id: current.version}, None
