"""Deciding what changes (SPEC §4), as pure functions.

The decision maker (LLM or rules) sees a candidate fact and the user's most similar live
memories numbered 1..k — never their real ids — and answers ADD, UPDATE(i), DELETE(i) or
NOOP. :func:`resolve` turns that answer into planned ops with deterministic op ids:

- an index the maker was not shown is rejected (:class:`InvalidDecision`: retried);
- a DELETE that comes with a new fact (a contradiction) becomes an UPDATE of the target, so
  the new fact is never lost; a DELETE without a new fact ("I no longer use mocks") stays;
- UPDATE closes the target version and opens ``version + 1`` under the same memory id;
- **event time wins**: a fact from messages older than the target's live version (their
  ``ts``, whatever order Kafka delivered them in) never replaces it. An UPDATE becomes
  history, a record of its own that is superseded from the start (``valid_to`` = the live
  version's ``valid_from``, ``extra.history_of`` = its memory); a retraction becomes a
  NOOP (see :func:`older_than_live`);
- a NOOP against a live version with a newer statement (a restatement) keeps the version
  and stamps it with the statement's event time (RESTATE, :func:`_restated`): a late fact
  older than the restatement then becomes history instead of replacing it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from memstream.core.errors import MemstreamError
from memstream.memory.model import (
    Memory,
    MemoryType,
    OpKind,
    Source,
    Status,
    new_memory_id,
)


class InvalidDecision(MemstreamError):
    """The decision names a memory it was not shown, or is otherwise unusable."""


@dataclass(frozen=True)
class Candidate:
    """A fact worth remembering, as extracted from the messages."""

    text: str
    type: MemoryType = MemoryType.EPISODIC
    importance: int = 5
    expires_in_days: float | None = None
    slot: str | None = None
    new_fact: bool = True  # False for a pure retraction ("I no longer use mocks")
    # the event time of the message that states it (None: not known, the job's newest
    # message dates it): a late message's fact is dated by itself, not by a newer message
    # the same job happened to hold
    said_at: float | None = None
    # the id of that message (None: not known): the memory's lineage is then that message
    # alone, not every message of the job (a retrieved memory points at what stated it)
    said_by: str | None = None
    # the old value the message says this fact replaces ("switched from Vim to Emacs":
    # "Vim"; None: not said): the rules decision updates the memory that names it
    replaces: str | None = None
    # a count of the slot that grew by this ("Little Nora arrived": one more child) with no
    # count said: the rules decision writes the slot's memory's count plus this
    grows: int = 0


@dataclass(frozen=True)
class Decision:
    op: OpKind
    target: int | None = None  # 1-based index into the memories shown
    reason: str = ""
    text: str | None = None  # what to write instead of the candidate's text (a count grown)


@dataclass(frozen=True)
class IdMap:
    """Real memory ids <-> the small integers the decision maker sees."""

    memories: tuple[Memory, ...]

    @classmethod
    def number(cls, hits: Sequence[tuple[Memory, float]],
               ) -> tuple[IdMap, list[tuple[int, Memory, float]]]:
        """Number similar memories 1..k for the decision maker; the map turns the numbers
        it answers with back into memories."""
        numbered = [(i, m, score) for i, (m, score) in enumerate(hits, start=1)]
        return cls(tuple(m for m, _ in hits)), numbered

    def lookup(self, index: int | None) -> Memory:
        if index is None or not 1 <= index <= len(self.memories):
            raise InvalidDecision(
                f"target {index!r} is not one of the {len(self.memories)} memories shown"
            )
        return self.memories[index - 1]


@dataclass(frozen=True)
class PlannedOp:
    """One change to apply.

    ``before`` is the live version it acts on (None for ADD), ``after`` the version it
    leaves (the new version; for DELETE the closed one), ``writes`` every version record
    to store — UPDATE writes the closed old version and the new one.
    """

    op_id: str
    kind: OpKind
    memory_id: str
    before: Memory | None
    after: Memory
    writes: tuple[Memory, ...]
    reason: str


def op_id(job_id: str, index: int, kind: OpKind, seq: int = 0) -> str:
    """Deterministic per (job, seq, candidate, kind): a job re-issued under a new seq (decided
    again after it was fenced) gets new ids, so one id never names two payloads."""
    raw = f"{job_id}\x1f{index}\x1f{kind.value}" + (f"\x1f{seq}" if seq else "")
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Context:
    """Where the candidate came from and when it is applied."""

    tenant_id: str
    user_id: str
    session_id: str
    from_seq: int
    to_seq: int
    job_id: str
    now: float
    message_ids: tuple[str, ...] = ()
    seq: int = 0  # the job's per-user sequence number
    event_ts: float | None = None  # the statement's (else the job's newest message's) time

    def said(self, c: Candidate) -> Context:
        """This context dated by the candidate's own statement, when it is known, and its
        lineage narrowed to the message that states it, when that is known."""
        ctx = self if c.said_at is None else replace(self, event_ts=c.said_at)
        return ctx if c.said_by is None else replace(ctx, message_ids=(c.said_by,))

    def source(self, op: str) -> Source:
        return Source(self.session_id, self.from_seq, self.to_seq, self.job_id, op,
                      self.message_ids, self.event_ts)


def older_than_live(ctx: Context, target: Memory) -> bool:
    """Whether the job's messages are older than the ones that made ``target``, the live
    version it would change (made or restated: :attr:`Memory.stated_ts`). Unknown on
    either side (tool writes, windowed jobs, older records): not older."""
    theirs = target.stated_ts
    return ctx.event_ts is not None and theirs is not None and ctx.event_ts < theirs


def _history(c: Candidate, index: int, ctx: Context, target: Memory, reason: str) -> PlannedOp:
    """A late fact kept as what was true before ``target``: its own record, superseded from
    the start, never live."""
    oid = op_id(ctx.job_id, index, OpKind.ADD, ctx.seq)
    mid = new_memory_id(oid)
    until = target.valid_from
    assert ctx.event_ts is not None
    past = _opened(c, ctx, oid, mid, 1, ctx.now).evolve(
        status=Status.SUPERSEDED, valid_from=min(ctx.event_ts, until), valid_to=until,
        slot=c.slot or target.slot, extra={"history_of": target.memory_id})
    return PlannedOp(oid, OpKind.ADD, mid, None, past, (past,),
                     f"older than the live version: kept as history ({reason})".strip())


def _restated(index: int, shown: IdMap, d: Decision, ctx: Context) -> list[PlannedOp]:
    """A restatement of a live version, newer than what made it (or last restated it): the
    version rewritten in place with the statement's event time, its vector kept. Anything
    else the NOOP says (no target, an unknown index, an older or undated statement):
    nothing."""
    if d.target is None or not 1 <= d.target <= len(shown.memories) or ctx.event_ts is None:
        return []
    target = shown.memories[d.target - 1]
    stated = target.stated_ts
    if not target.live or (stated is not None and ctx.event_ts <= stated):
        return []
    oid = op_id(ctx.job_id, index, OpKind.RESTATE, ctx.seq)
    restated = target.evolve(updated_at=max(target.updated_at, ctx.now), extra={
        **target.extra, "restated_ts": ctx.event_ts, "restated_by": oid})
    return [PlannedOp(oid, OpKind.RESTATE, target.memory_id, target, restated, (restated,),
                      d.reason or "restated")]


def restamped(op: PlannedOp, stated: float) -> PlannedOp:
    """``op`` with the live version it writes stamped as stated at ``stated`` (a later
    statement of it in the same job)."""
    after = op.after.evolve(extra={**op.after.extra, "restated_ts": stated})
    writes = tuple(after if (w.memory_id, w.version) == (after.memory_id, after.version) else w
                   for w in op.writes)
    return replace(op, after=after, writes=writes)


def opens_version(op: PlannedOp) -> bool:
    """Whether ``op`` writes a version that needs its own vector (ADD, UPDATE, history);
    a DELETE closes one and a RESTATE restamps one: the stored vector is kept."""
    return op.kind not in (OpKind.DELETE, OpKind.RESTATE)


def _expires(c: Candidate, now: float) -> float | None:
    return None if c.expires_in_days is None else now + c.expires_in_days * 86_400


def _opened(c: Candidate, ctx: Context, op: str, memory_id: str, version: int,
            created_at: float) -> Memory:
    return Memory(
        memory_id=memory_id, tenant_id=ctx.tenant_id, user_id=ctx.user_id, type=c.type,
        content=c.text, importance=max(1, min(10, c.importance)), created_at=created_at,
        updated_at=ctx.now, valid_from=ctx.now, expires_at=_expires(c, ctx.now),
        source=ctx.source(op), version=version, slot=c.slot,
    )


def resolve(c: Candidate, index: int, shown: IdMap, d: Decision, ctx: Context) -> list[PlannedOp]:
    """Planned ops for candidate number ``index`` of job ``ctx.job_id``."""
    ctx = ctx.said(c)
    if d.text is not None:
        c = replace(c, text=d.text)
    kind = d.op
    if kind == OpKind.NOOP:
        return _restated(index, shown, d, ctx)
    if kind == OpKind.DELETE and c.new_fact:
        kind = OpKind.UPDATE  # a contradiction: replace, never drop the new fact
    oid = op_id(ctx.job_id, index, kind, ctx.seq)
    if kind == OpKind.ADD:
        mid = new_memory_id(oid)
        added = _opened(c, ctx, oid, mid, 1, ctx.now)
        return [PlannedOp(oid, kind, mid, None, added, (added,), d.reason)]
    target = shown.lookup(d.target)
    if older_than_live(ctx, target):
        return [] if kind == OpKind.DELETE else [_history(c, index, ctx, target, d.reason)]
    # ``closed_ts``: when the statement that closed it was made (event time), beside
    # ``valid_to`` (when it was applied): what retrieval dates "no longer true since" by
    closed = target.evolve(
        valid_to=ctx.now, updated_at=ctx.now,
        status=Status.SUPERSEDED if kind == OpKind.UPDATE else Status.DELETED,
        extra={**target.extra, "closed_by": oid, "closed_job": ctx.job_id,
               **({"closed_ts": ctx.event_ts} if ctx.event_ts is not None else {})},
    )
    if kind == OpKind.DELETE:
        return [PlannedOp(oid, kind, target.memory_id, target, closed, (closed,), d.reason)]
    opened = _opened(c, ctx, oid, target.memory_id, target.version + 1, target.created_at)
    opened = opened.evolve(slot=c.slot or target.slot,
                           importance=max(opened.importance, target.importance))
    return [PlannedOp(oid, kind, target.memory_id, target, opened, (closed, opened), d.reason)]
