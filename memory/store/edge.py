"""The embedded default store: the Qdrant engine in-process (qdrant-edge-py 0.9.0)."""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pydantic_core

from memstream.memory import lexical
from memstream.memory.access_stats import AccessStats
from memstream.memory.archive import TURN_STATUS
from memstream.memory.fencing import Cursor, Published
from memstream.memory.model import Memory
from memstream.memory.store import (
    APPLIED_BY,
    CURSOR_STATUS,
    HIDDEN_STATUSES,
    INDEXED_FLOATS,
    INDEXED_KEYWORDS,
    LINEAGE,
    NOT_OPS,
    SPARSE,
    Record,
    Scope,
    StoreError,
    TurnWindow,
    access_from,
    access_payload,
    access_point_id,
    applied_among,
    cursor_from,
    cursor_payload,
    cursor_point_id,
    live_from,
    published_from,
    published_payload,
    published_point_id,
    record_vectors,
    unit_vector,
)

_DOC = "_doc"
LIST_KEPT_RECORDS = 64  # list answers up to this long are kept (EdgeStore.list) ...
LIST_KEPT_ANSWERS = 4096  # ... this many, the least recently read dropped first
# The shard's search pool: one thread. A pool reads a shard's segments in parallel, and a
# shard here is one segment (nothing optimizes it into more), so a second thread only adds
# a hand-off: a filtered search of 100k memories took 337 us with one thread against 463
# us with the default (one per CPU, 2 here), and 548 us with 2 (benchmarks: docs/benchmarks.md).
SEARCH_THREADS = 1
_TOP = tuple(k for k in INDEXED_KEYWORDS if "." not in k) + INDEXED_FLOATS
log = logging.getLogger(__name__)
_NESTED = tuple(tuple(k.split(".", 1)) for k in INDEXED_KEYWORDS if "." in k)


@functools.lru_cache(maxsize=8192)
def matching(key: str, values: tuple[str, ...]) -> Any:
    """The condition "``key`` is one of ``values``", made once: the binding takes ~7 us to
    build a ``MatchAny`` condition (it tries the match types in turn) against 0.3 us for
    one ``MatchValue``, and every search, list and count builds three or four (a user's,
    the statuses, the slots kept out). One value is a ``MatchValue``, the same match."""
    import qdrant_edge as qe

    match = qe.MatchValue(values[0]) if len(values) == 1 else qe.MatchAny(list(values))
    return qe.FieldCondition(key=key, match=match)


class EdgeStore:
    """Persistent on disk at ``path``; one process owns a path."""

    def __init__(self, path: Path, dim: int) -> None:
        import qdrant_edge as qe

        self._qe = qe
        self._lock = threading.Lock()  # the shard is shared by the worker's threads
        self._doc_only = qe.PayloadSelector.Include([_DOC])
        self._lists: OrderedDict[tuple[Any, ...], tuple[Memory, ...]] = OrderedDict()
        self._dim = dim
        path.mkdir(parents=True, exist_ok=True)
        shard_dir = path / "shard"
        # The write-ahead log stays on, a rebuild's new store included: it cannot be turned
        # on later, and a store the worker serves must not lose an acknowledged write.
        config = _config(qe, dim, sparse=True)
        self.lexical = True  # the archive's words are indexed (a shard made before: not)
        try:
            if shard_dir.exists() and any(shard_dir.iterdir()):
                try:
                    self._shard = qe.EdgeShard.load(str(shard_dir), config)
                except Exception as exc:
                    if "incompatible" not in str(exc).lower():
                        raise
                    self._shard = qe.EdgeShard.load(str(shard_dir), _config(qe, dim, sparse=False))
                    self.lexical = False
                    log.warning("the store at %s predates the archive's word index: archived "
                                "turns are searched by meaning only until it is rebuilt "
                                "(memstream rebuild)", shard_dir)
                self._index_lineage()
            else:
                self._shard = qe.EdgeShard.create(str(shard_dir), config)
                for name in INDEXED_KEYWORDS:
                    self._shard.update(qe.UpdateOperation.create_field_index(
                        name, qe.PayloadSchemaType.Keyword))
                for name in INDEXED_FLOATS:
                    self._shard.update(qe.UpdateOperation.create_field_index(
                        name, qe.PayloadSchemaType.Float))
        except Exception as exc:
            hint = (f" (the embedder's vectors have {dim} dimensions: start with the embedder "
                    "the store was built with, or rebuild it with this one)"
                    if "incompatible" in str(exc).lower() else "")
            raise StoreError(f"cannot open the Qdrant Edge shard at {shard_dir}: {exc}{hint}"
                             ) from exc

    def _index_lineage(self) -> None:
        """A shard made before versions were found by their lineage (:meth:`versions`) gets
        the index, and its memory versions the packed field it reads, once, here."""
        qe = self._qe
        if LINEAGE in (self._shard.info().payload_schema or {}):
            return
        self._shard.update(qe.UpdateOperation.create_field_index(
            LINEAGE, qe.PayloadSchemaType.Keyword))
        memories = qe.Filter(must_not=[matching("status", HIDDEN_STATUSES)])
        offset: Any = None
        n = 0
        while True:
            records, offset = self._shard.scroll(qe.ScrollRequest(
                offset=offset, limit=1024, filter=memories, with_payload=True))
            for r in records:
                self._shard.update(qe.UpdateOperation.overwrite_payload(
                    [r.id], pack(unpack(r.payload))))
            n += len(records)
            if offset is None:
                break
        self._shard.flush()
        log.info("indexed the lineage of %d memory versions (once, for a shard made before it)",
                 n)

    def _filter(self, scope: Scope, statuses: Sequence[str] | None,
                extra: list[Any] | None = None, exclude_slots: Sequence[str] = (),
                hidden: tuple[str, ...] = HIDDEN_STATUSES) -> Any:
        must = [matching("tenant_id", (scope.tenant_id,)),
                matching("user_id", tuple(scope.users())), *(extra or [])]
        must_not = []
        if statuses is not None:
            must.append(matching("status", tuple(statuses)))
        else:
            must_not.append(matching("status", hidden))
        if exclude_slots:
            must_not.append(matching("slot", tuple(exclude_slots)))
        return self._qe.Filter(must=must, must_not=must_not or None)

    def _kinds(self, types: Sequence[str] | None, slots: Sequence[str] | None) -> list[Any]:
        conds = []
        if types is not None:
            conds.append(matching("type", tuple(types)))
        if slots is not None:
            conds.append(matching("slot", tuple(slots)))
        return conds

    def write(self, memories: Sequence[Memory], vectors: Sequence[list[float] | None]) -> None:
        self.write_records([(m.point_id, m.to_payload(), v)
                            for m, v in zip(memories, vectors, strict=True)])

    def write_records(self, records: Sequence[Record]) -> None:
        qe = self._qe
        points = [qe.Point(pid, record_vectors(p, v, self.lexical, qe.SparseVector), pack(p))
                  for pid, p, v in records if v is not None]
        with self._lock:
            if any(p.get("status") != TURN_STATUS for _, p, _ in records):
                self._memories_changed()  # (an archived turn is in no list answer)
            if points:
                self._shard.update(qe.UpdateOperation.upsert_points(points))
            for pid, payload, v in records:
                if v is None:
                    self._shard.update(qe.UpdateOperation.overwrite_payload([pid],
                                                                            pack(payload)))
            # No flush per write: updates go through the shard's write-ahead log, and the
            # memory-change topic can rebuild the store anyway. close() flushes.

    def search_turns(self, scope: Scope, k: int, *, vector: list[float] | None = None,
                     sparse: lexical.Sparse | None = None, window: TurnWindow | None = None,
                     ) -> list[tuple[dict[str, Any], float]]:
        qe = self._qe
        own = Scope(scope.tenant_id, scope.user_id)
        where = self._filter(own, (TURN_STATUS,), _window(qe, window))
        if vector is not None:
            request = qe.QueryRequest(limit=k, query=qe.Query.Nearest(vector), filter=where,
                                      with_payload=self._doc_only)
        elif sparse and self.lexical:
            corpus = self._filter(own, (TURN_STATUS,))
            request = qe.QueryRequest(
                limit=k, filter=where, with_payload=self._doc_only,
                query=qe.Query.Nearest(qe.SparseVector(indices=list(sparse.indices),
                                                       values=list(sparse.values)), using=SPARSE),
                params=qe.SearchParams(idf=qe.IdfParams(corpus=corpus)))
        else:
            return []
        with self._lock:
            hits = self._shard.query(request)
            docs = self._records(hits)
        return [(d, float(h.score)) for h, d in zip(hits, docs, strict=True)]

    def versions(self, scope: Scope, *, memory_ids: Sequence[str] = (),
                 message_ids: Sequence[str] = ()) -> list[Memory]:
        qe = self._qe
        should = [qe.FieldCondition(key=key, match=qe.MatchAny(list(dict.fromkeys(ids))))
                  for key, ids in (("memory_id", memory_ids), (LINEAGE, message_ids)) if ids]
        if not should:
            return []
        own = Scope(scope.tenant_id, scope.user_id)
        where = self._filter(own, None, [qe.Filter(should=should)])
        found: list[Memory] = []
        offset: Any = None
        with self._lock:
            while True:
                records, offset = self._shard.scroll(qe.ScrollRequest(
                    offset=offset, limit=256, filter=where, with_payload=self._doc_only))
                found += [Memory.from_payload(d) for d in self._records(records)]
                if offset is None:
                    return found

    def sweep_turns(self, before: float) -> int:
        qe = self._qe
        old = qe.Filter(must=[matching("status", (TURN_STATUS,)),
                              qe.FieldCondition(key="ts", range=qe.RangeFloat(lt=before))])
        with self._lock:
            n = int(self._shard.count(qe.CountRequest(filter=old)))
            if n:
                self._shard.update(qe.UpdateOperation.delete_points_by_filter(old))
        return n

    def _records(self, points: Sequence[Any]) -> list[dict[str, Any]]:
        """The records of points read with their ``_doc`` only (a read of a hot path: the
        binding converts a payload key by key); a record written before packing has no
        ``_doc`` and is read again whole. Called with the lock held."""
        docs = [(p.payload or {}).get(_DOC) for p in points]
        older = [p.id for p, d in zip(points, docs, strict=True) if not isinstance(d, str)]
        whole = {str(r.id): unpack(r.payload)
                 for r in (self._shard.retrieve(older, True, False) if older else ())}
        return [_loads(d) if isinstance(d, str) else whole.get(str(p.id), {})
                for p, d in zip(points, docs, strict=True)]

    def search(self, scope: Scope, vector: list[float], k: int,
               statuses: Sequence[str] = ("active",), *, types: Sequence[str] | None = None,
               exclude_slots: Sequence[str] = ()) -> list[tuple[Memory, float]]:
        qe = self._qe
        where = self._filter(scope, statuses, self._kinds(types, None), exclude_slots)
        request = qe.QueryRequest(limit=k, query=qe.Query.Nearest(vector), filter=where,
                                  with_payload=self._doc_only)
        with self._lock:
            hits = self._shard.query(request)
            docs = self._records(hits)
        return [(Memory.from_payload(d), float(h.score)) for h, d in zip(hits, docs, strict=True)]

    def list(self, scope: Scope, statuses: Sequence[str] | None = ("active",),
             limit: int = 10_000, *, types: Sequence[str] | None = None,
             slots: Sequence[str] | None = None) -> list[Memory]:
        """A short answer (a user's rules, core blocks) is kept until the next write of a
        memory record here (:meth:`_memories_changed`): every search reads the rules."""
        qe = self._qe
        key = (scope.tenant_id, tuple(scope.users()), None if statuses is None else
               tuple(statuses), limit, None if types is None else tuple(types),
               None if slots is None else tuple(slots))
        with self._lock:
            kept = self._lists.get(key)
            if kept is not None:
                self._lists.move_to_end(key)
                return list(kept)
            records, _ = self._shard.scroll(qe.ScrollRequest(
                limit=limit, filter=self._filter(scope, statuses, self._kinds(types, slots)),
                with_payload=self._doc_only))
            found = [Memory.from_payload(d) for d in self._records(records)]
            if len(found) <= LIST_KEPT_RECORDS and (
                    statuses is None or not set(statuses) & set(HIDDEN_STATUSES)):
                self._lists[key] = tuple(found)
                if len(self._lists) > LIST_KEPT_ANSWERS:
                    self._lists.popitem(last=False)
        return found

    def _memories_changed(self) -> None:
        """Every write that may add, change or remove a memory record calls this (with the
        lock held): the kept list answers are void. (Hit statistics and cursors are no
        memory records: no list answer holds them.)"""
        self._lists.clear()

    def op_applied(self, scope: Scope, op_id: str) -> bool:
        qe = self._qe
        for key in APPLIED_BY:
            cond = qe.FieldCondition(key=key, match=qe.MatchValue(op_id))
            with self._lock:
                n = self._shard.count(qe.CountRequest(
                    filter=self._filter(scope, None, [cond], hidden=NOT_OPS)))
            if n:
                return True
        return False

    def ops_applied(self, scope: Scope, op_ids: Sequence[str]) -> set[str]:
        ids = list(dict.fromkeys(op_ids))
        if not ids:
            return set()
        qe = self._qe
        any_mark = qe.Filter(should=[qe.FieldCondition(key=key, match=qe.MatchAny(ids))
                                     for key in APPLIED_BY])
        limit = 4 * len(ids) + 10  # an op leaves at most three records
        with self._lock:
            records, _ = self._shard.scroll(qe.ScrollRequest(
                limit=limit, with_payload=True,
                filter=self._filter(scope, None, [any_mark], hidden=NOT_OPS)))
        if len(records) >= limit:  # more than the ops can have left: one by one
            return {i for i in ids if self.op_applied(scope, i)}
        return applied_among(ids, (unpack(r.payload) for r in records))

    def live_versions(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, int]:
        if not memory_ids:
            return {}
        qe = self._qe
        cond = qe.FieldCondition(key="memory_id", match=qe.MatchAny(list(memory_ids)))
        with self._lock:
            records, _ = self._shard.scroll(qe.ScrollRequest(
                limit=10 * len(memory_ids) + 10, with_payload=True,
                filter=self._filter(scope, ["active"], [cond])))
        return live_from(unpack(r.payload) for r in records)

    def cursor(self, scope: Scope) -> Cursor | None:
        with self._lock:
            found = self._shard.retrieve([cursor_point_id(scope.tenant_id, scope.user_id)],
                                         True, False)
        return cursor_from(scope, (unpack(r.payload) for r in found))

    def set_cursor(self, scope: Scope, cursor: Cursor,
                   published: Sequence[str] | None = None) -> None:
        qe = self._qe
        points = [qe.Point(cursor_point_id(scope.tenant_id, scope.user_id),
                           unit_vector(self._dim), pack(cursor_payload(scope, cursor)))]
        if published is not None:
            kept = Published(cursor, tuple(published))
            points.append(qe.Point(published_point_id(scope.tenant_id, scope.user_id),
                                   unit_vector(self._dim), pack(published_payload(scope, kept))))
        with self._lock:
            self._shard.update(qe.UpdateOperation.upsert_points(points))

    def published(self, scope: Scope) -> Published | None:
        with self._lock:
            found = self._shard.retrieve([published_point_id(scope.tenant_id, scope.user_id)],
                                         True, False)
        return published_from(scope, (unpack(r.payload) for r in found))

    def scan(self, tenant_id: str | None = None, user_id: str | None = None, *,
             vectors: bool = False, page: int = 1024) -> Iterator[Record]:
        qe = self._qe
        must = [qe.FieldCondition(key=k, match=qe.MatchValue(v))
                for k, v in (("tenant_id", tenant_id), ("user_id", user_id)) if v is not None]
        where = qe.Filter(must=must) if must else None
        offset: Any = None
        while True:
            with self._lock:
                records, offset = self._shard.scroll(qe.ScrollRequest(
                    offset=offset, limit=page, filter=where, with_payload=True,
                    with_vector=vectors))
            for r in records:
                yield str(r.id), unpack(r.payload), _dense(r.vector) if vectors else None
            if offset is None:
                return

    def delete_records(self, point_ids: Sequence[str]) -> None:
        if point_ids:
            with self._lock:
                self._memories_changed()
                self._shard.update(self._qe.UpdateOperation.delete_points(list(point_ids)))

    def erase(self, scope: Scope) -> int:
        return self.erase_users([scope])

    def erase_users(self, scopes: Sequence[Scope], *, flush: bool = True) -> int:
        """:meth:`erase` for several users, then one flush (``flush=False``: none, for a
        store being built: a rebuild's fold flushes once at its end; no user: a flush)."""
        qe = self._qe
        n = 0
        with self._lock:
            self._memories_changed()
            for scope in scopes:
                own = Scope(scope.tenant_id, scope.user_id)  # never the global user's
                everything = qe.Filter(
                    must=[qe.FieldCondition(key="tenant_id", match=qe.MatchValue(own.tenant_id)),
                          qe.FieldCondition(key="user_id", match=qe.MatchValue(own.user_id))],
                    must_not=[qe.FieldCondition(key="status",
                                                match=qe.MatchValue(CURSOR_STATUS))])
                n += int(self._shard.count(qe.CountRequest(filter=self._filter(own, None))))
                self._shard.update(qe.UpdateOperation.delete_points_by_filter(everything))
            if flush:
                self._shard.flush()
        return n

    def access_stats(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, AccessStats]:
        if not memory_ids:
            return {}
        ids: list[Any] = [access_point_id(scope.tenant_id, scope.user_id, m) for m in memory_ids]
        with self._lock:
            found = self._records(self._shard.retrieve(ids, self._doc_only, False))
        return access_from(scope, found)

    def put_access(self, scope: Scope, stats: Sequence[AccessStats]) -> None:
        qe = self._qe
        points = [qe.Point(access_point_id(scope.tenant_id, scope.user_id, s.memory_id),
                           unit_vector(self._dim), pack(access_payload(scope, s)))
                  for s in stats]
        if points:
            with self._lock:
                self._shard.update(qe.UpdateOperation.upsert_points(points))

    def count(self) -> int:
        qe = self._qe
        records = qe.Filter(must_not=[qe.FieldCondition(
            key="status", match=qe.MatchAny(list(HIDDEN_STATUSES)))])
        with self._lock:
            return int(self._shard.count(qe.CountRequest(filter=records)))

    def close(self) -> None:
        with self._lock:
            self._lists.clear()  # a read after close fails as before, never a kept answer
            try:
                self._shard.flush()
            finally:  # a failed flush still lets the shard's files go
                self._shard.close()


def _config(qe: Any, dim: int, *, sparse: bool) -> Any:
    """The shard's configuration: the dense vector; with ``sparse``, the archive's words
    (BM25 weights from memory.lexical, IDF applied by the engine)."""
    return qe.EdgeConfig(
        vectors=qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine),
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)}
        if sparse else None,
        max_search_threads=SEARCH_THREADS)


def _window(qe: Any, window: TurnWindow | None) -> list[Any]:
    """The conditions of a turn search's session and time range."""
    if window is None:
        return []
    conds = []
    if window.session_id is not None:
        conds.append(matching("session_id", (window.session_id,)))
    if window.since is not None or window.until is not None:
        conds.append(qe.FieldCondition(key="ts", range=qe.RangeFloat(
            gte=window.since, lt=window.until)))
    return conds


def pack(payload: dict[str, Any]) -> dict[str, Any]:
    """What Edge stores of a record: the fields filters name, plus the whole record as one
    JSON string. qdrant-edge-py converts a payload key by key (~4 us a key, most of a
    write's cost): 8 keys instead of ~25 make writes (and reads) 2-3x faster."""
    packed = {k: payload[k] for k in _TOP if payload.get(k) is not None}
    for outer, inner in _NESTED:
        value = (payload.get(outer) or {}).get(inner)
        if value is not None:
            packed.setdefault(outer, {})[inner] = value
    packed[_DOC] = _json(payload)
    return packed


def _json(payload: dict[str, Any]) -> str:
    """Compact JSON, UTF-8 kept (``json.dumps(separators=(",", ":"), ensure_ascii=False)``,
    read back the same) by pydantic-core: 2 us instead of 9 per record."""
    try:
        return pydantic_core.to_json(payload, inf_nan_mode="constants").decode()
    except (pydantic_core.PydanticSerializationError, UnicodeDecodeError):
        # what only Python's encoder takes (a lone surrogate; Edge refuses it anyway)
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def unpack(payload: dict[str, Any] | None) -> dict[str, Any]:
    """The record a payload holds (records written before packing are returned as read)."""
    payload = payload or {}
    doc = payload.get(_DOC)
    return _loads(doc) if isinstance(doc, str) else dict(payload)


def _loads(doc: str) -> Any:
    """``json.loads`` by pydantic-core (the same values, 2x faster: a search reads ~25
    records, a restore every one)."""
    try:
        return pydantic_core.from_json(doc)
    except (ValueError, TypeError):  # what only Python's decoder takes (a lone surrogate)
        return json.loads(doc)


def _dense(vector: Any) -> list[float] | None:
    """The unnamed dense vector of a scrolled record (Edge returns it by name or plain)."""
    if isinstance(vector, dict):
        vector = vector.get("")
    return None if vector is None else [float(x) for x in vector]
