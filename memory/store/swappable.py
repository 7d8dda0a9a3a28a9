"""A store the worker can switch to a rebuilt one without stopping reads (issue 10).

:class:`SwappableStore` is the worker's store: it passes every call to the current store
and remembers, per user, when it last wrote for them. The switch (memstream.memory.store.switch)
relies on that: a user not written for a few minutes has every write's change event
committed on the memory-change topic (a transaction lives at most 60 s), so the catch-up
from the topic is complete for them; a user written since is copied from the live store
itself under the write lock (:func:`copy_user`: exact, whatever the topic shows yet).
Reads never take the lock: a read sees the old store or the new one, each complete.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from memstream.memory.access_stats import AccessStats
from memstream.memory.fencing import Cursor, Published
from memstream.memory.lexical import Sparse
from memstream.memory.model import Memory
from memstream.memory.store import MemoryStore, Record, Scope, TurnWindow

UserKey = tuple[str, str]
PRUNE_AFTER_S = 3600.0  # write times older than this are forgotten (a switch looks back less)


class SwappableStore:
    def __init__(self, store: MemoryStore, clock: Callable[[], float] = time.monotonic) -> None:
        self._current = store
        self._lock = threading.RLock()
        self._clock = clock
        self._written: dict[UserKey, float] = {}
        self._writes = 0

    @property
    def current(self) -> MemoryStore:
        return self._current

    # --- writes: under the lock, remembering whose -----------------------------------------
    def _do(self, users: Iterable[UserKey], call: Callable[[MemoryStore], Any]) -> Any:
        with self._lock:
            now = self._clock()
            for key in users:
                self._written[key] = now
            self._writes += 1
            if self._writes % 10_000 == 0:
                self._written = {k: t for k, t in self._written.items()
                                 if t > now - PRUNE_AFTER_S}
            return call(self._current)

    def write(self, memories: Sequence[Memory], vectors: Sequence[list[float] | None]) -> None:
        self._do({(m.tenant_id, m.user_id) for m in memories},
                 lambda s: s.write(memories, vectors))

    def write_records(self, records: Sequence[Record]) -> None:
        self._do({(str(p.get("tenant_id")), str(p.get("user_id"))) for _, p, _ in records},
                 lambda s: s.write_records(records))

    def set_cursor(self, scope: Scope, cursor: Cursor,
                   published: Sequence[str] | None = None) -> None:
        self._do([(scope.tenant_id, scope.user_id)],
                 lambda s: s.set_cursor(scope, cursor, published))

    def put_access(self, scope: Scope, stats: Sequence[AccessStats]) -> None:
        self._do([(scope.tenant_id, scope.user_id)], lambda s: s.put_access(scope, stats))

    def delete_records(self, point_ids: Sequence[str]) -> None:
        self._do((), lambda s: s.delete_records(point_ids))

    def erase(self, scope: Scope) -> int:
        return int(self._do([(scope.tenant_id, scope.user_id)], lambda s: s.erase(scope)))

    # --- the switch -------------------------------------------------------------------------
    def now(self) -> float:
        return self._clock()

    def written_since(self, since: float) -> set[UserKey]:
        with self._lock:
            return {k for k, t in self._written.items() if t >= since}

    def locked(self, since: float, critical: Callable[[MemoryStore, set[UserKey]], bool],
               new: MemoryStore | None = None) -> bool:
        """Run ``critical(live, users written since)`` with writes held; if it returns
        True and ``new`` is given, ``new`` becomes the current store before they resume."""
        with self._lock:
            users = {k for k, t in self._written.items() if t >= since}
            done = critical(self._current, users)
            if done and new is not None:
                self._current = new
            return done

    # --- reads: the current store ---------------------------------------------------------
    def search(self, scope: Scope, vector: list[float], k: int,
               statuses: Sequence[str] = ("active",), *, types: Sequence[str] | None = None,
               exclude_slots: Sequence[str] = ()) -> list[tuple[Memory, float]]:
        return self._current.search(scope, vector, k, statuses, types=types,
                                    exclude_slots=exclude_slots)

    def search_turns(self, scope: Scope, k: int, *, vector: list[float] | None = None,
                     sparse: Sparse | None = None, window: TurnWindow | None = None,
                     ) -> list[tuple[dict[str, Any], float]]:
        return self._current.search_turns(scope, k, vector=vector, sparse=sparse,
                                          window=window)

    def versions(self, scope: Scope, *, memory_ids: Sequence[str] = (),
                 message_ids: Sequence[str] = ()) -> list[Memory]:
        return self._current.versions(scope, memory_ids=memory_ids, message_ids=message_ids)

    def sweep_turns(self, before: float) -> int:
        return self._current.sweep_turns(before)

    def list(self, scope: Scope, statuses: Sequence[str] | None = ("active",),
             limit: int = 10_000, *, types: Sequence[str] | None = None,
             slots: Sequence[str] | None = None) -> list[Memory]:
        return self._current.list(scope, statuses, limit, types=types, slots=slots)

    def op_applied(self, scope: Scope, op_id: str) -> bool:
        return self._current.op_applied(scope, op_id)

    def ops_applied(self, scope: Scope, op_ids: Sequence[str]) -> set[str]:
        return self._current.ops_applied(scope, op_ids)

    def live_versions(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, int]:
        return self._current.live_versions(scope, memory_ids)

    def cursor(self, scope: Scope) -> Cursor | None:
        return self._current.cursor(scope)

    def published(self, scope: Scope) -> Published | None:
        return self._current.published(scope)

    def access_stats(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, AccessStats]:
        return self._current.access_stats(scope, memory_ids)

    def scan(self, tenant_id: str | None = None, user_id: str | None = None, *,
             vectors: bool = False, page: int = 1024) -> Iterator[Record]:
        return self._current.scan(tenant_id, user_id, vectors=vectors, page=page)

    def count(self) -> int:
        return self._current.count()

    def close(self) -> None:
        self._current.close()


def copy_user(src: MemoryStore, dst: MemoryStore, tenant: str, user: str) -> int:
    """Make ``dst`` hold exactly ``src``'s records of one user (versions with their
    vectors, hit statistics, the cursor): written first, then what ``dst`` has beyond
    them deleted, so a reader of ``dst`` never sees the user empty. Returns the records."""
    records = list(src.scan(tenant, user, vectors=True))
    keep = {pid for pid, _, _ in records}
    stale = [pid for pid, _, _ in dst.scan(tenant, user) if pid not in keep]
    if records:
        dst.write_records(records)
    dst.delete_records(stale)
    return len(records)


def copy_cursors(src: MemoryStore, dst: MemoryStore) -> int:
    """Every cursor of ``src`` into ``dst`` where it is ahead: the live store moves a
    user's cursor for jobs that changed nothing (no change event), which a rebuild from
    the topic cannot know, and fencing must never go back."""
    from memstream.memory.store import CURSOR_STATUS, cursor_from

    copied = 0
    for _, payload, _ in src.scan():
        if payload.get("status") != CURSOR_STATUS:
            continue
        scope = Scope(str(payload["tenant_id"]), str(payload["user_id"]))
        ahead = cursor_from(scope, [payload])
        held = dst.cursor(scope)
        if ahead is not None and (held is None or held.seq < ahead.seq):
            dst.set_cursor(scope, ahead)
            copied += 1
    return copied
