"""Rebuilding a store from the topics (SPEC §9): the memory-change topic replayed in order,
then the memory-access topic folded, into an empty store. No LLM call, no embedding.

Both inputs are idempotent (a change seen before is skipped; an access event is counted
once by id), and hit statistics live apart from the version records
(:mod:`memory.access`), so the two folds are independent of each other's order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from memstream.memory import access
from memstream.memory.apply import apply_change
from memstream.memory.store import MemoryStore, Scope
from memstream.topics.schemas import AccessEvent, MemoryChange


@dataclass(frozen=True)
class Rebuilt:
    changes: int  # applied now
    skipped: int  # seen before
    access_records: int  # statistics records written
    unreadable: int = 0  # sealed with a data key that is gone (a forgotten user)


def fold_access(store: MemoryStore, events: Iterable[AccessEvent]) -> int:
    """Fold access events into the store, user by user; returns the records written."""
    by_user: dict[tuple[str, str], list[access.Access]] = defaultdict(list)
    for e in events:
        by_user[(e.tenant_id, e.user_id)].append(
            access.Access(e.event_id, e.kind.value, tuple(e.memory_ids), e.ts.timestamp()))
    written = 0
    for (tenant, user), folded in by_user.items():
        scope = Scope(tenant, user)
        current = store.access_stats(scope, access.memory_ids(folded))
        changed = access.fold(current, folded)
        store.put_access(scope, list(changed.values()))
        written += len(changed)
    return written


def rebuild(store: MemoryStore, changes: Iterable[MemoryChange],
            accesses: Iterable[AccessEvent] = (),
            opener: Callable[[MemoryChange], MemoryChange | None] | None = None) -> Rebuilt:
    """``opener`` opens sealed change events (:mod:`memory.crypto`); one it cannot open
    (its user was forgotten: the key is shredded) is skipped, so a rebuild never
    resurrects a forgotten user."""
    applied = skipped = unreadable = 0
    for change in changes:
        opened = opener(change) if opener is not None else change
        if opened is None or opened.sealed:
            unreadable += 1
        elif apply_change(store, opened):
            applied += 1
        else:
            skipped += 1
    return Rebuilt(applied, skipped, fold_access(store, accesses), unreadable)
