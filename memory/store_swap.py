"""A store the worker can switch to a rebuilt one without stopping reads (issue 10).

:class:`SwappableStore` is the worker's store: it passes every call to the current store.
A switch (streams.store_swap) goes: :meth:`start_mirror` (from now on every write to the
live store is also queued), catch the new store up from the topics to past that moment,
then :meth:`switch`: under the write lock the queued writes are replayed on the new store,
in order, and the new store becomes the current one. Reads never wait on a switch beyond
one pointer assignment; writes wait for the replay of the queue (milliseconds).

Why a queue and not writing to both stores at once: the catch-up replays older changes,
and a newer write applied first would move the user's cursor past them, so the catch-up
would skip them (``apply_change`` never goes back). Replayed after the catch-up, in live
order, every record ends as its last live write left it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from memstream.memory.access import AccessStats
from memstream.memory.fencing import Cursor
from memstream.memory.model import Memory
from memstream.memory.store import MemoryStore, Record, Scope

Write = Callable[[MemoryStore], object]


class SwappableStore:
    def __init__(self, store: MemoryStore) -> None:
        self._current = store
        self._lock = threading.RLock()
        self._queue: list[Write] | None = None

    @property
    def current(self) -> MemoryStore:
        return self._current

    # --- writes: to the current store, and queued while a switch is prepared ------------
    def _do(self, call: Write) -> Any:
        with self._lock:
            out = call(self._current)
            if self._queue is not None:
                self._queue.append(call)
            return out

    def write(self, memories: Sequence[Memory], vectors: Sequence[list[float] | None]) -> None:
        memories, vectors = list(memories), list(vectors)
        self._do(lambda s: s.write(memories, vectors))

    def write_records(self, records: Sequence[Record]) -> None:
        records = list(records)
        self._do(lambda s: s.write_records(records))

    def set_cursor(self, scope: Scope, cursor: Cursor) -> None:
        self._do(lambda s: s.set_cursor(scope, cursor))

    def put_access(self, scope: Scope, stats: Sequence[AccessStats]) -> None:
        stats = list(stats)
        self._do(lambda s: s.put_access(scope, stats))

    def erase(self, scope: Scope) -> int:
        return int(self._do(lambda s: s.erase(scope)))

    # --- the switch ---------------------------------------------------------------------
    def start_mirror(self) -> None:
        with self._lock:
            self._queue = []

    def stop_mirror(self) -> None:
        with self._lock:
            self._queue = None

    def switch(self, new: MemoryStore,
               check: Callable[[MemoryStore, MemoryStore], bool] | None = None,
               replace: Callable[[MemoryStore, MemoryStore], None] | None = None) -> bool:
        """Replay the queued writes on ``new``; then, if ``check(live, new)`` holds (or no
        check), make ``new`` current — or, with ``replace``, copy what it should from
        ``new`` into the live store instead (a partial rebuild). Returns whether it did."""
        with self._lock:
            queued, self._queue = self._queue or [], None
            for call in queued:
                call(new)
            if check is not None and not check(self._current, new):
                return False
            if replace is not None:
                replace(self._current, new)
            else:
                self._current = new
            return True

    # --- reads: the current store ---------------------------------------------------------
    def search(self, scope: Scope, vector: list[float], k: int,
               statuses: Sequence[str] = ("active",), *, types: Sequence[str] | None = None,
               exclude_slots: Sequence[str] = ()) -> list[tuple[Memory, float]]:
        return self._current.search(scope, vector, k, statuses, types=types,
                                    exclude_slots=exclude_slots)

    def list(self, scope: Scope, statuses: Sequence[str] | None = ("active",),
             limit: int = 10_000, *, types: Sequence[str] | None = None,
             slots: Sequence[str] | None = None) -> list[Memory]:
        return self._current.list(scope, statuses, limit, types=types, slots=slots)

    def op_applied(self, scope: Scope, op_id: str) -> bool:
        return self._current.op_applied(scope, op_id)

    def live_versions(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, int]:
        return self._current.live_versions(scope, memory_ids)

    def cursor(self, scope: Scope) -> Cursor | None:
        return self._current.cursor(scope)

    def access_stats(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, AccessStats]:
        return self._current.access_stats(scope, memory_ids)

    def scan(self, tenant_id: str | None = None, user_id: str | None = None, *,
             vectors: bool = False, page: int = 1024) -> Iterator[Record]:
        return self._current.scan(tenant_id, user_id, vectors=vectors, page=page)

    def count(self) -> int:
        return self._current.count()

    def close(self) -> None:
        self._current.close()


def copy_users(users: Sequence[tuple[str, str]]) -> Callable[[MemoryStore, MemoryStore], None]:
    """A partial rebuild's switch: each user's records in the live store are replaced by
    the rebuilt ones (versions with their vectors, hit statistics); the live cursor stays."""
    from memstream.memory.store import ACCESS_STATUS, CURSOR_STATUS

    def replace(live: MemoryStore, new: MemoryStore) -> None:
        for tenant, user in users:
            scope = Scope(tenant, user)
            versions: list[Memory] = []
            vectors: list[list[float] | None] = []
            stats: list[AccessStats] = []
            for _, payload, vector in new.scan(tenant, user, vectors=True):
                status = payload.get("status")
                if status == ACCESS_STATUS:
                    stats.append(AccessStats.from_payload(payload["access"]))
                elif status != CURSOR_STATUS:
                    versions.append(Memory.from_payload(payload))
                    vectors.append(vector)
            live.erase(scope)
            live.write(versions, vectors)
            live.put_access(scope, stats)

    return replace
