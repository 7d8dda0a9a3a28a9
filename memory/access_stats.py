"""Hit recording (SPEC §5, §8): folding access events into per-memory statistics, pure.

Retrievals publish :class:`AccessEvent` records (which memories a query returned, and
feedback: used / not useful) on the memory-access topic; the worker folds them into one
statistics record per memory, stored beside the memory's versions (a hidden record, not a
field of the version records). Kept apart on purpose:

- a version record is written only by the decide → apply path; statistics written into it
  would race an UPDATE of the same memory (and could bring a closed version back to life);
- the memory-change topic stays free of hit counts, so replaying it and folding the access
  topic are independent, and a rebuild gives the same numbers in either order.

Idempotent by event id: a record remembers the ids of the last ``KEEP_EVENTS`` events it
folded, so an event delivered twice (a worker killed between the store write and the offset
commit re-reads at most its uncommitted tail) is counted once. ``last_accessed_at`` is a
max, so order does not matter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

KEEP_EVENTS = 64


@dataclass(frozen=True)
class AccessStats:
    memory_id: str
    last_accessed_at: float | None = None
    access_count: int = 0
    used: int = 0
    not_useful: int = 0
    recent_events: tuple[str, ...] = ()

    def to_payload(self) -> dict[str, Any]:
        return {"memory_id": self.memory_id, "last_accessed_at": self.last_accessed_at,
                "access_count": self.access_count, "used": self.used,
                "not_useful": self.not_useful, "recent_events": list(self.recent_events)}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> AccessStats:
        return cls(str(data["memory_id"]), data.get("last_accessed_at"),
                   int(data.get("access_count") or 0), int(data.get("used") or 0),
                   int(data.get("not_useful") or 0), tuple(data.get("recent_events") or ()))


@dataclass(frozen=True)
class Access:
    """One access event, reduced to what the fold needs (kind: hit | used | not_useful)."""

    event_id: str
    kind: str
    memory_ids: tuple[str, ...]
    ts: float


def fold_one(stats: AccessStats, event: Access, keep: int = KEEP_EVENTS) -> AccessStats:
    """``stats`` with ``event`` counted, unless it was counted before."""
    if event.event_id in stats.recent_events:
        return stats
    seen = (*stats.recent_events, event.event_id)[-keep:]
    if event.kind == "hit":
        last = event.ts if stats.last_accessed_at is None else max(stats.last_accessed_at,
                                                                   event.ts)
        return replace(stats, access_count=stats.access_count + 1, last_accessed_at=last,
                       recent_events=seen)
    if event.kind == "used":
        return replace(stats, used=stats.used + 1, recent_events=seen)
    return replace(stats, not_useful=stats.not_useful + 1, recent_events=seen)


def fold(current: Mapping[str, AccessStats], events: Iterable[Access],
         keep: int = KEEP_EVENTS) -> dict[str, AccessStats]:
    """Fold events (in order) into the statistics of the memories they name; returns only
    the records that changed."""
    state = dict(current)
    changed: dict[str, AccessStats] = {}
    for event in events:
        for memory_id in dict.fromkeys(event.memory_ids):
            before = state.get(memory_id) or AccessStats(memory_id)
            after = fold_one(before, event, keep)
            if after is not before:
                state[memory_id] = changed[memory_id] = after
    return changed


def memory_ids(events: Iterable[Access]) -> list[str]:
    return list(dict.fromkeys(m for e in events for m in e.memory_ids))
