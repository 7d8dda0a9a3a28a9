"""The episodic archive (pure): every non-trivial user and assistant turn kept per user
beside the memories, searchable by meaning and by words, whatever the extractor kept.

- **A turn record** is one message: its text, role, session, message id, seq in the session
  and event time, with the turn before it in the session as its *context* (the question a
  reply answers, the reply a statement follows). Its vectors are of the two together (the
  dense one from the embedder, the sparse one from :mod:`memory.lexical`), and its lineage
  is both messages: at most two turns, never a job's whole range.
- **Written like a memory.** The extract stage adds an ``archive`` change per turn to the
  job's decision (no LLM call), so the apply stage stores it and publishes it on the
  memory-change topic in the decision's transaction, fenced by the user's cursor: a kill
  loses or doubles no turn, and a rebuild, a shard restore, a standby and a replay get the
  archive from the topic that already rebuilds the memories. (The messages topic keeps 7
  days by default: it cannot rebuild anything older.)
- **Its life.** ``archive_days`` bounds it by event time: reads never return an older turn
  and the apply stage sweeps them from the store. A forget-me erases the user's turns with
  their memories.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from memstream.memory.model import version_point_id
from memstream.memory.trigger_rules import is_trivial
from memstream.topics.schemas import ExtractionJob, JobMessage, Lineage, MemoryChange, Role

TURN_STATUS = "turn"  # a turn record's status: never a memory's, never in a memory query
ARCHIVE_OP = "archive"
ARCHIVED_ROLES = (Role.USER, Role.ASSISTANT)
_TEXT = ("content", "context")  # a turn's text: in its record only
DAY_S = 86_400.0


def turn_id(tenant_id: str, user_id: str, session_id: str, message_id: str) -> str:
    raw = f"turn\x1f{tenant_id}\x1f{user_id}\x1f{session_id}\x1f{message_id}"
    return "t-" + hashlib.sha256(raw.encode()).hexdigest()[:30]


def turn_point_id(memory_id: str) -> str:
    return version_point_id(memory_id, 1)


def archived(message: JobMessage) -> bool:
    """Whether a message is kept: a user or assistant turn with something in it."""
    return message.role in ARCHIVED_ROLES and not is_trivial(message.content)


def indexed_text(payload: dict[str, Any]) -> str:
    """What a turn's vectors are made of: its context turn, then the turn."""
    context = payload.get("context") or {}
    before = str(context.get("content") or "")
    return f"{before}\n{payload['content']}" if before else str(payload["content"])


def turn_payload(job: ExtractionJob, message: JobMessage, context: JobMessage | None,
                 change_id: str) -> dict[str, Any]:
    """The stored record of one turn: the message and its context, nothing of the job
    (the same message archived again writes the same record)."""
    return {
        "memory_id": turn_id(job.tenant_id, job.user_id, job.session_id, message.message_id),
        "version": 1, "tenant_id": job.tenant_id, "user_id": job.user_id,
        "status": TURN_STATUS, "session_id": job.session_id,
        "message_id": message.message_id, "seq": message.seq, "role": message.role.value,
        "content": message.content, "ts": message.ts.timestamp(),
        "context": None if context is None else {
            "message_id": context.message_id, "role": context.role.value,
            "content": context.content, "ts": context.ts.timestamp()},
        "source": {"op_id": change_id},
    }


def archive_change_id(job: ExtractionJob, message: JobMessage) -> str:
    """Per (job, seq, message): a range re-issued under a new seq gets new ids, so one id
    never names two payloads (as :func:`memory.decisions.op_id`)."""
    raw = f"{job.job_id}\x1f{ARCHIVE_OP}\x1f{message.seq}\x1f{job.seq}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def turns_of(job: ExtractionJob) -> list[tuple[JobMessage, JobMessage | None]]:
    """The job's new messages to archive, each with the session's message before it."""
    if job.tool is not None:
        return []
    by_seq = {m.seq: m for m in (*job.context, *job.messages)}
    out = []
    for m in job.messages:
        if job.from_seq <= m.seq < job.to_seq and archived(m):
            before = by_seq.get(m.seq - 1)
            out.append((m, before if before is not None and before.role in ARCHIVED_ROLES
                        and before.content.strip() else None))
    return out


def archive_changes(job: ExtractionJob, embed: Callable[[list[str]], list[list[float]]],
                    model: str, now: float) -> list[MemoryChange]:
    """The ``archive`` changes of a job's turns (one embedding call for all of them)."""
    turns = turns_of(job)
    if not turns:
        return []
    payloads = [turn_payload(job, m, before, archive_change_id(job, m)) for m, before in turns]
    vectors = embed([indexed_text(p) for p in payloads])
    decided = datetime.fromtimestamp(now, UTC)
    # the text once, in the record: ``after`` names the turn without it (a job's decision
    # carries every turn, and must stay a record the decisions topic takes)
    return [MemoryChange(
        change_id=p["source"]["op_id"], op=ARCHIVE_OP, tenant_id=job.tenant_id,
        user_id=job.user_id, memory_id=p["memory_id"], version=1, before=None,
        after={k: v for k, v in p.items() if k not in _TEXT}, records=[p], vector=v, reason="",
        lineage=Lineage(session_id=job.session_id, from_seq=m.seq, to_seq=m.seq + 1,
                        job_id=job.job_id, message_ids=lineage_ids(p), seq=job.seq,
                        kind="archive"),
        model=model, prompt_version="-", decided_at=decided)
        for (m, _), p, v in zip(turns, payloads, vectors, strict=True)]


def lineage_ids(payload: dict[str, Any]) -> list[str]:
    context = payload.get("context") or {}
    own = str(payload["message_id"])
    return [str(context["message_id"]), own] if context.get("message_id") else [own]


def cutoff(now: float, days: float | None) -> float | None:
    """The oldest event time kept (None: kept until erased)."""
    return None if days is None else now - days * DAY_S


# --- retrieval -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Turn:
    """An archived turn as retrieval returns it."""

    memory_id: str
    session_id: str
    message_id: str
    seq: int
    role: str
    content: str
    ts: float
    context: dict[str, Any] | None
    score: float = 0.0

    @classmethod
    def from_payload(cls, payload: dict[str, Any], score: float = 0.0) -> Turn:
        return cls(str(payload["memory_id"]), str(payload["session_id"]),
                   str(payload["message_id"]), int(payload.get("seq", 0)),
                   str(payload["role"]), str(payload["content"]), float(payload["ts"]),
                   payload.get("context"), score)

    @property
    def message_ids(self) -> tuple[str, ...]:
        own = self.message_id
        before = (self.context or {}).get("message_id")
        return (str(before), own) if before else (own,)


def weighted_rrf(lists: Sequence[tuple[float, Sequence[str]]], k: float) -> dict[str, float]:
    """Reciprocal-rank fusion: each list's items by rank, ``weight / (k + rank)`` summed."""
    fused: dict[str, float] = {}
    for weight, items in lists:
        if weight <= 0:
            continue
        for rank, key in enumerate(items, 1):
            fused[key] = fused.get(key, 0.0) + weight / (k + rank)
    return fused


def stated_by(turn: Turn, lineages: Sequence[Sequence[str]]) -> bool:
    """Whether a memory states this turn in full: its lineage holds the turn's message and
    lies within the turn's messages (the memory came from this exchange alone, so the turn
    adds nothing to it; a memory of the context turn alone does not state this one)."""
    own = set(turn.message_ids)
    return any(turn.message_id in ids and set(ids) <= own for ids in lineages)
