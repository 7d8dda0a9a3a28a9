"""Effects exactly once, in job order, per user (SPEC §4): the fencing rules, pure.

Every extraction job of a user carries a strictly increasing ``seq`` (assigned by the ingest
stage, kept by a re-sent job). The store keeps, per user, a :class:`Cursor`: the last job it
applied and which decision of that job it applied. With it, whatever a crash, a restart or a
replayed topic hands the apply stage, one rule decides (:func:`verdict`):

- a job above the cursor is new: it is applied (if the memories it read have not moved on);
- the very decision the cursor names is being seen again (the worker died after the store
  took it, before its events were committed): REPUBLISH;
- another decision of the job the cursor names (the job was decided twice to other ops:
  re-sent, or re-consumed after a crash): DONE, nothing of this decision is applied.
  Either way the events the store's decision published may have been lost with an aborted
  transaction (a SIGKILL): the change events the store kept with the cursor
  (:class:`Published`) are published again, byte for byte, then the job's result; never
  this decision's own, so one change id always means one payload;
- anything else at or below the cursor is fenced: never applied. If the ingest stage is still
  waiting for it (its state was rolled back or forgotten), it re-issues the range under a seq
  above the cursor.

The extract stage asks the same question before it pays for an LLM call
(:func:`decide_or_skip`). Why a cursor and not only per-op idempotency: an old job decided
again against a newer store produces *new* ops (the Dublin -> Buenos Aires -> Dublin rollback
of the issue); op ids cannot recognise it, the job's position in the user's order can.

A decision also states the live version of every stored memory it read; a change whose
memory moved on since is never applied over the newer version (:func:`moved_on`): the whole
decision is fenced and the job decided again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class Cursor:
    """The last job of one user whose changes are all in the store."""

    seq: int
    job_id: str
    decision_id: str = ""

    def to_payload(self) -> dict[str, Any]:
        return {"seq": self.seq, "job_id": self.job_id, "decision_id": self.decision_id}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Cursor:
        return cls(int(data["seq"]), str(data["job_id"]), str(data.get("decision_id", "")))


@dataclass(frozen=True)
class Published:
    """The change events of job ``job`` as first published (each event's JSON, in order),
    kept in the store with the cursor, in the same write."""

    job: Cursor
    changes: tuple[str, ...] = ()

    def to_payload(self) -> dict[str, Any]:
        return {"job": self.job.to_payload(), "changes": list(self.changes)}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Published:
        return cls(Cursor.from_payload(data["job"]), tuple(str(c) for c in data["changes"]))


class Verdict(StrEnum):
    APPLY = "apply"  # a new job: check versions, apply, move the cursor
    REPUBLISH = "republish"  # this very decision is applied: publish the kept events again
    DONE = "done"  # another decision of this job is applied: report done, publish the kept
    FENCED = "fenced"  # a later (or other) job holds the cursor: never apply this one


def verdict(cursor: Cursor | None, seq: int, job_id: str, decision_id: str | None) -> Verdict:
    """What to do with decision ``decision_id`` of job ``job_id`` number ``seq``.

    ``seq`` 0 means "not sequenced" (records written before sequencing existed): applied
    by op-id idempotency alone and never recorded in the cursor.
    """
    if seq == 0 or cursor is None or seq > cursor.seq:
        return Verdict.APPLY
    if seq == cursor.seq and job_id == cursor.job_id:
        # no decision id (a failed or skipped job; a cursor a replay wrote): not this one
        same = bool(decision_id) and decision_id == cursor.decision_id
        return Verdict.REPUBLISH if same else Verdict.DONE
    return Verdict.FENCED


def decide_or_skip(cursor: Cursor | None, seq: int, job_id: str) -> Verdict:
    """Before deciding: APPLY (decide it), DONE (already applied) or FENCED."""
    return verdict(cursor, seq, job_id, None)


def republished(cursor: Cursor | None, kept: Published | None) -> tuple[str, ...]:
    """The change events to publish again for the cursor's job: those the store kept with
    that very cursor (none for a job that changed nothing). None kept with it (a cursor a
    rebuild or a store switch wrote, whose job's events are on the topic already; a store
    written before events were kept): nothing."""
    if cursor is None or kept is None or kept.job != cursor:
        return ()
    return kept.changes


@dataclass(frozen=True)
class Touch:
    """What one change of a decision does to one memory: the live version it leaves."""

    change_id: str
    memory_id: str
    version_before: int | None  # None: the memory is new (ADD)
    version_after: int | None  # None: the memory is no longer live (DELETE)


def moved_on(read: Mapping[str, int], live: Mapping[str, int], touches: Iterable[Touch],
             applied: set[str]) -> str | None:
    """The first memory the decision read whose live version is not what it should be now.

    ``read``: memory id -> live version the decision saw; ``live``: what the store holds live
    now; ``applied``: change ids of this decision already in the store (a crash in the middle
    of applying it), whose memories legitimately moved on to the version they leave.
    """
    expected: dict[str, int | None] = dict(read)
    for t in touches:  # in the decision's order
        if t.change_id in applied:
            expected[t.memory_id] = t.version_after
        else:  # what it acts on must still be live as it saw it (an earlier one may say)
            expected.setdefault(t.memory_id, t.version_before)
    for memory_id, version in expected.items():
        if live.get(memory_id) != version:
            return memory_id
    return None


def timeless(value: Any) -> Any:
    """``value`` without its wall-clock fields (``decided_at``, a record's ``created_at``,
    ``valid_from``, ``expires_at``...: every key ending in ``_at``, and ``valid_from`` /
    ``valid_to``), at any depth."""
    if isinstance(value, Mapping):
        return {k: timeless(v) for k, v in value.items()
                if not (str(k).endswith("_at") or k in ("valid_from", "valid_to"))}
    if isinstance(value, list | tuple):
        return [timeless(v) for v in value]
    return value


def decision_id(parts: Iterable[Any]) -> str:
    """A digest naming one decision by what it does, wall clock left out (:func:`timeless`):
    the same job decided to the same ops at two times has one id; to other ops, another."""
    raw = json.dumps(timeless(list(parts)), sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]
