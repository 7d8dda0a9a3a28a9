"""Rebuilding a store from the topics (SPEC §9): the memory-change topic replayed in order,
then the memory-access topic folded, into an empty store. No LLM call (and no embedding,
unless the rebuild re-embeds with another embedder).

:func:`apply_change` (memory.applying) replays one change against a store: ~5 store round
trips (cursor, seen-before check, write, cursor again). :class:`Fold` gives the same
records for a whole stream into an *empty* store with the bookkeeping in memory (each
user's cursor and the changes seen) and the writes batched: one upsert per
``batch`` records, a record rewritten inside a batch written once, a forget-me's erasure
done with the batch (before its writes), the store flushed once at the end if anything was
erased rather than after each forget-me. The unit tests hold the two paths equal record
for record; ``benchmarks/rebuild.py`` measures them side by side.

Both inputs are idempotent (a change seen before is skipped; an access event is counted
once by id), and hit statistics live apart from the version records
(:mod:`memory.access_stats`), so the two folds are independent of each other's order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from memstream.memory import access_stats as access
from memstream.memory.archive import TURN_STATUS, indexed_text
from memstream.memory.fencing import Cursor
from memstream.memory.model import version_point_id
from memstream.memory.store import MemoryStore, Scope
from memstream.topics.schemas import AccessEvent, MemoryChange

Opener = Callable[[MemoryChange], MemoryChange | None]
Reembed = Callable[[list[str]], list[list[float]]]
UserKey = tuple[str, str]


@runtime_checkable
class ErasesMany(Protocol):
    """A store that erases several users at once, flushing to disk when asked, and only
    flushing when given no user (``EdgeStore``)."""

    def erase_users(self, scopes: Sequence[Scope], *, flush: bool = True) -> int: ...


@dataclass(frozen=True)
class Rebuilt:
    changes: int  # applied now
    skipped: int  # seen before
    access_records: int  # statistics records written
    unreadable: int = 0  # sealed with a data key that is gone (a forgotten user)


def fold_access(store: MemoryStore, events: Iterable[AccessEvent],
                select: Callable[[str, str], bool] | None = None,
                erased: Mapping[UserKey, float] | None = None) -> int:
    """Fold access events into the store, user by user; returns the records written.
    ``erased``: user -> time of their last forget-me; their hits before it stay erased."""
    by_user: dict[UserKey, list[access.Access]] = defaultdict(list)
    for e in events:
        key = (e.tenant_id, e.user_id)
        if erased and key in erased and e.ts.timestamp() <= erased[key]:
            continue
        if select is None or select(e.tenant_id, e.user_id):
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


@dataclass
class Fold:
    """The change stream folded into an empty ``store``, batched (see the module doc).

    The same rules as :func:`memory.applying.apply_change`: a change of a job older than the
    user's cursor is skipped (a forget-me is never undone), a change seen before is
    skipped, an ``erase`` deletes the user's records and keeps the cursor. ``reembed``
    recomputes each new version's vector from its content (another embedder); payload-only
    writes keep the vector stored with the version.
    """

    store: MemoryStore
    opener: Opener | None = None
    reembed: Reembed | None = None
    batch: int = 4096
    select: Callable[[str, str], bool] | None = None  # a partial rebuild: which users
    applied: int = 0
    skipped: int = 0
    unreadable: int = 0
    erased: dict[UserKey, float] = field(default_factory=dict)  # user -> last forget-me
    _cursors: dict[UserKey, Cursor] = field(default_factory=dict)
    _seen: dict[UserKey, set[str]] = field(default_factory=lambda: defaultdict(set))
    _held: dict[str, tuple[dict[str, Any], list[float] | None]] = field(default_factory=dict)
    _fresh: set[str] = field(default_factory=set)  # held records whose vector is to compute
    _erasing: dict[UserKey, None] = field(default_factory=dict)  # erased before the held

    def add(self, change: MemoryChange) -> None:
        if self.select is not None and not self.select(change.tenant_id, change.user_id):
            return
        opened = self.opener(change) if self.opener is not None else change
        if opened is None or opened.sealed:
            self.unreadable += 1
            return
        key = (opened.tenant_id, opened.user_id)
        seq, cursor = opened.lineage.seq, self._cursors.get(key)
        if seq and cursor is not None and seq < cursor.seq:
            self.skipped += 1
            return
        if opened.op == "erase":
            self._erase(key)
            self.erased[key] = opened.decided_at.timestamp()
        elif opened.change_id in self._seen[key]:
            self.skipped += 1
            return
        else:
            self._hold(opened)
            self._seen[key].add(opened.change_id)
        if seq and (cursor is None or cursor.seq < seq):
            self._cursors[key] = Cursor(seq, opened.lineage.job_id)
        self.applied += 1

    def _hold(self, change: MemoryChange) -> None:
        for payload in change.records:  # payloads as they are: no Memory objects made
            if (payload.get("tenant_id"), payload.get("user_id")) != (change.tenant_id,
                                                                      change.user_id):
                raise ValueError(f"change {change.change_id} writes outside its user's scope")
            pid = version_point_id(payload["memory_id"], payload["version"])
            if payload["source"]["op_id"] == change.change_id:  # the version it opens
                self._held[pid] = (payload, change.vector)
                if self.reembed is not None:
                    self._fresh.add(pid)
            else:  # a version it closes: payload only, the vector stays
                held = self._held.get(pid)
                self._held[pid] = (payload, held[1] if held is not None else None)
        if len(self._held) >= self.batch:
            self.flush()

    def _erase(self, key: UserKey) -> None:
        """The user's held records dropped, the stored ones erased with the next flush,
        before the records held after this (the user's memories since the forget-me)."""
        self._seen.pop(key, None)
        for pid in [p for p, (payload, _) in self._held.items()
                    if (payload["tenant_id"], payload["user_id"]) == key]:
            del self._held[pid]
            self._fresh.discard(pid)
        self._erasing[key] = None

    def flush(self) -> None:
        if self._erasing:
            scopes = [Scope(*key) for key in self._erasing]
            if isinstance(self.store, ErasesMany):
                self.store.erase_users(scopes, flush=False)  # flushed by finish()
            else:
                for scope in scopes:
                    self.store.erase(scope)
            self._erasing.clear()
        if not self._held:
            return
        fresh = [pid for pid in self._held if pid in self._fresh]
        vectors = dict(zip(fresh, self.reembed([_embedded(self._held[p][0]) for p in fresh]),
                           strict=True)) if fresh and self.reembed is not None else {}
        self.store.write_records([(pid, payload, vectors.get(pid, vector))
                                  for pid, (payload, vector) in self._held.items()])
        self._held.clear()
        self._fresh.clear()

    def finish(self) -> dict[UserKey, Cursor]:
        """Write what is held and every user's cursor; returns the cursors."""
        self.flush()
        for (tenant, user), cursor in self._cursors.items():
            self.store.set_cursor(Scope(tenant, user), cursor)
        if self.erased and isinstance(self.store, ErasesMany):
            self.store.erase_users([], flush=True)  # the erasures on disk now, once
        return dict(self._cursors)


def _embedded(payload: dict[str, Any]) -> str:
    """The text a record's vector is of (an archived turn's: with its context)."""
    return indexed_text(payload) if payload.get("status") == TURN_STATUS else payload["content"]


def rebuild(store: MemoryStore, changes: Iterable[MemoryChange],
            accesses: Iterable[AccessEvent] = (),
            opener: Opener | None = None, *, reembed: Reembed | None = None,
            select: Callable[[str, str], bool] | None = None, batch: int = 4096) -> Rebuilt:
    """``opener`` opens sealed change events (:mod:`sealing.envelope`); one it cannot open
    (its user was forgotten: the key is shredded) is skipped, so a rebuild never
    resurrects a forgotten user. ``store`` must be empty."""
    fold = Fold(store, opener, reembed, batch, select)
    for change in changes:
        fold.add(change)
    fold.finish()
    return Rebuilt(fold.applied, fold.skipped,
                   fold_access(store, accesses, select, fold.erased), fold.unreadable)
