"""The embedded store split by partition: one Qdrant Edge shard per partition of the topics.

A user's memories live in the shard of the user's partition (the partition of the key
``tenant/user``), so the shard follows the Kafka partition from worker to worker and is
restored from the memory-change topic, its changelog (:mod:`streams.shards`). This module
is the store side only: :class:`PartitionedStore` implements the store protocol by sending
every scoped call to its user's shard, and raises :class:`ShardNotHere` for a user whose
shard this worker does not serve (yet), so the caller waits or forwards.

- **owned** shards are written (the apply and access stages) and read;
- **standby** shards follow the change topic of partitions other workers own; they are read
  only when a request says so (:func:`standby_reads`: the owner is unreachable);
- the **global** shard holds the tenant-wide memories (user ``__global__``) every user's
  search includes; every worker keeps one, fed by the global-changes topic. The global
  user's own shard (its partition's owner) is where they are written and fenced.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aiokafka.partitioner import murmur2

from memstream.memory.access_stats import AccessStats
from memstream.memory.fencing import Cursor, Published
from memstream.memory.lexical import Sparse
from memstream.memory.model import GLOBAL_USER, Memory
from memstream.memory.store import MemoryStore, Record, Scope, StoreError, TurnWindow

PartitionOf = Callable[[str, str], int]
SHARDS_DIR = "store"  # data_dir/store/<partition>, data_dir/store/global
_STANDBY: contextvars.ContextVar[bool] = contextvars.ContextVar("standby_reads", default=False)


class ShardNotHere(StoreError):
    """This worker does not serve the shard of this user's partition now."""

    def __init__(self, partition: int, why: str = "not owned here") -> None:
        super().__init__(f"the store shard of partition {partition} is {why}")
        self.partition = partition


@contextlib.contextmanager
def standby_reads() -> Iterator[None]:
    """Reads in this context may be served by a standby shard (slightly behind)."""
    token = _STANDBY.set(True)
    try:
        yield
    finally:
        _STANDBY.reset(token)


class PartitionedStore:
    """The store protocol over per-partition shards (see the module doc)."""

    def __init__(self, partition_of: PartitionOf) -> None:
        self.partition_of = partition_of
        self.owned: dict[int, MemoryStore] = {}
        self.standby: dict[int, MemoryStore] = {}
        self.global_shard: MemoryStore | None = None
        # whether the global shard may hold anything (False while no global change was ever
        # folded into it): an empty one is not asked, a search costs one shard call then
        self.global_filled = True

    # --- which shard ---------------------------------------------------------------------

    def shard(self, tenant_id: str, user_id: str, *, write: bool = False) -> MemoryStore:
        p = self.partition_of(tenant_id, user_id)
        found = self.owned.get(p)
        if found is None and not write and _STANDBY.get():
            found = self.standby.get(p)
        if found is None:
            raise ShardNotHere(p)
        return found

    def _scoped(self, scope: Scope, *, write: bool = False) -> MemoryStore:
        return self.shard(scope.tenant_id, scope.user_id, write=write)

    def _global(self, scope: Scope) -> MemoryStore | None:
        """The shard to add the global scope from, or None (not asked, or the user's own
        shard holds them: the global user itself)."""
        if not scope.include_global or scope.user_id == GLOBAL_USER or not self.global_filled:
            return None
        return self.global_shard

    # --- writes --------------------------------------------------------------------------

    def write(self, memories: Sequence[Memory], vectors: Sequence[list[float] | None]) -> None:
        self.write_records([(m.point_id, m.to_payload(), v)
                            for m, v in zip(memories, vectors, strict=True)])

    def write_records(self, records: Sequence[Record]) -> None:
        by_shard: dict[int, list[Record]] = {}
        for record in records:
            payload = record[1]
            p = self.partition_of(str(payload["tenant_id"]), str(payload["user_id"]))
            by_shard.setdefault(p, []).append(record)
        for p, rs in by_shard.items():
            if p not in self.owned:
                raise ShardNotHere(p)
            self.owned[p].write_records(rs)

    def set_cursor(self, scope: Scope, cursor: Cursor,
                   published: Sequence[str] | None = None) -> None:
        self._scoped(scope, write=True).set_cursor(scope, cursor, published)

    def put_access(self, scope: Scope, stats: Sequence[AccessStats]) -> None:
        self._scoped(scope, write=True).put_access(scope, stats)

    def delete_records(self, point_ids: Sequence[str]) -> None:
        for shard in self.owned.values():
            shard.delete_records(point_ids)

    def erase(self, scope: Scope) -> int:
        return self._scoped(Scope(scope.tenant_id, scope.user_id), write=True).erase(scope)

    # --- reads ---------------------------------------------------------------------------

    def search(self, scope: Scope, vector: list[float], k: int,
               statuses: Sequence[str] = ("active",), *, types: Sequence[str] | None = None,
               exclude_slots: Sequence[str] = ()) -> list[tuple[Memory, float]]:
        own = Scope(scope.tenant_id, scope.user_id)
        shard, shared = self._scoped(own), self._global(scope)
        with self._closing(own, shard, shared):
            found = shard.search(own, vector, k, statuses, types=types,
                                 exclude_slots=exclude_slots)
            if shared is not None:
                everyone = Scope(scope.tenant_id, GLOBAL_USER)
                found += shared.search(everyone, vector, k, statuses, types=types,
                                       exclude_slots=exclude_slots)
                found = heapq.nlargest(k, found, key=lambda hit: hit[1])
        return found

    def list(self, scope: Scope, statuses: Sequence[str] | None = ("active",),
             limit: int = 10_000, *, types: Sequence[str] | None = None,
             slots: Sequence[str] | None = None) -> list[Memory]:
        own = Scope(scope.tenant_id, scope.user_id)
        shard, shared = self._scoped(own), self._global(scope)
        with self._closing(own, shard, shared):
            found = shard.list(own, statuses, limit, types=types, slots=slots)
            if shared is not None and len(found) < limit:
                found += shared.list(Scope(scope.tenant_id, GLOBAL_USER), statuses,
                                     max(0, limit - len(found)), types=types, slots=slots)
        return found

    def search_turns(self, scope: Scope, k: int, *, vector: builtins.list[float] | None = None,
                     sparse: Sparse | None = None, window: TurnWindow | None = None,
                     ) -> builtins.list[tuple[dict[str, Any], float]]:
        own = Scope(scope.tenant_id, scope.user_id)  # the archive is the user's alone
        shard = self._scoped(own)
        with self._closing(own, shard):
            return shard.search_turns(own, k, vector=vector, sparse=sparse, window=window)

    def versions(self, scope: Scope, *, memory_ids: Sequence[str] = (),
                 message_ids: Sequence[str] = ()) -> builtins.list[Memory]:
        own = Scope(scope.tenant_id, scope.user_id)  # the user's own, as their turns
        shard = self._scoped(own)
        with self._closing(own, shard):
            return shard.versions(own, memory_ids=memory_ids, message_ids=message_ids)

    def sweep_turns(self, before: float) -> int:
        return sum(shard.sweep_turns(before) for shard in list(self.owned.values()))

    @contextlib.contextmanager
    def _closing(self, scope: Scope, *shards: MemoryStore | None) -> Iterator[None]:
        """A read that fails because its shard was closed meanwhile (the partition moved
        away, the worker is stopping) is ShardNotHere (the API answers 503: retry), not an
        internal error."""
        try:
            yield
        except ShardNotHere:
            raise
        except Exception as exc:
            served = [*self.owned.values(), *self.standby.values(), self.global_shard]
            if any(s is not None and all(s is not t for t in served) for s in shards):
                p = self.partition_of(scope.tenant_id, scope.user_id)
                raise ShardNotHere(p, "closed while it was read") from exc
            raise

    def op_applied(self, scope: Scope, op_id: str) -> bool:
        return self._scoped(scope).op_applied(scope, op_id)

    def ops_applied(self, scope: Scope, op_ids: Sequence[str]) -> set[str]:
        return self._scoped(scope).ops_applied(scope, op_ids)

    def live_versions(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, int]:
        return self._scoped(scope).live_versions(scope, memory_ids)

    def cursor(self, scope: Scope) -> Cursor | None:
        return self._scoped(scope).cursor(scope)

    def published(self, scope: Scope) -> Published | None:
        return self._scoped(scope).published(scope)

    def access_stats(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, AccessStats]:
        if scope.user_id == GLOBAL_USER or not memory_ids:
            return {}
        return self._scoped(scope).access_stats(scope, memory_ids)

    def scan(self, tenant_id: str | None = None, user_id: str | None = None, *,
             vectors: bool = False, page: int = 1024) -> Iterator[Record]:
        """The owned shards' records (one user: that user's shard only)."""
        if tenant_id is not None and user_id is not None:
            shards: list[MemoryStore] = [self.shard(tenant_id, user_id)]
        else:
            shards = [self.owned[p] for p in sorted(self.owned)]
        for shard in shards:
            yield from shard.scan(tenant_id, user_id, vectors=vectors, page=page)

    def count(self) -> int:
        return sum(shard.count() for shard in list(self.owned.values()))

    def close(self) -> None:
        for shard in [*self.owned.values(), *self.standby.values(),
                      *([self.global_shard] if self.global_shard else [])]:
            with contextlib.suppress(Exception):
                shard.close()
        self.owned.clear()
        self.standby.clear()
        self.global_shard = None


def partition_of(tenant_id: str, user_id: str, partitions: int) -> int:
    """The partition of a user's key ``tenant/user``: what the Java client's default
    partitioner picks (murmur2), so a shard follows the topics."""
    return partition_of_key(f"{tenant_id}/{user_id}".encode(), partitions)


def partition_of_key(key: bytes, partitions: int) -> int:
    """murmur2(key) % partitions, as the Java client and aiokafka place a keyed record (and
    as memstream places its own records: streams.placement re-routes producers' others)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
