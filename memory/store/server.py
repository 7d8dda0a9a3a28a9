"""A Qdrant server through qdrant-client (multi-worker deployments; ":memory:" in tests)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

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


class ServerStore:
    def __init__(self, collection: str, dim: int, *, client: Any) -> None:
        from qdrant_client import models

        self._m = models
        self._client = client
        self.collection = collection
        self._dim = dim
        try:
            if not client.collection_exists(collection):
                client.create_collection(
                    collection, vectors_config=models.VectorParams(
                        size=dim, distance=models.Distance.COSINE),
                    sparse_vectors_config={SPARSE: models.SparseVectorParams(
                        modifier=models.Modifier.IDF)})
                for name in INDEXED_KEYWORDS:
                    client.create_payload_index(collection, name,
                                                models.PayloadSchemaType.KEYWORD)
                for name in INDEXED_FLOATS:
                    client.create_payload_index(collection, name,
                                                models.PayloadSchemaType.FLOAT)
            info = client.get_collection(collection)
            if LINEAGE not in (info.payload_schema or {}):  # made before versions were
                client.create_payload_index(collection, LINEAGE,  # found by their lineage
                                            models.PayloadSchemaType.KEYWORD)
            # a collection made before the archive has no word index: turns by meaning only
            sparse = info.config.params.sparse_vectors or {}
            self.lexical = SPARSE in sparse
        except Exception as exc:
            raise StoreError(f"cannot prepare collection {collection!r}: {exc}") from exc

    @classmethod
    def connect(cls, url: str, api_key: str | None, collection: str, dim: int) -> ServerStore:
        from qdrant_client import QdrantClient

        return cls(collection, dim, client=QdrantClient(url=url, api_key=api_key))

    def _filter(self, scope: Scope, statuses: Sequence[str] | None,
                extra: list[Any] | None = None, exclude_slots: Sequence[str] = (),
                hidden: tuple[str, ...] = HIDDEN_STATUSES) -> Any:
        m = self._m
        must: list[Any] = [
            m.FieldCondition(key="tenant_id", match=m.MatchValue(value=scope.tenant_id)),
            m.FieldCondition(key="user_id", match=m.MatchAny(any=scope.users())),
            *(extra or []),
        ]
        must_not: list[Any] = []
        if statuses is not None:
            must.append(m.FieldCondition(key="status", match=m.MatchAny(any=list(statuses))))
        else:
            must_not.append(m.FieldCondition(key="status",
                                             match=m.MatchAny(any=list(hidden))))
        if exclude_slots:
            must_not.append(m.FieldCondition(key="slot",
                                             match=m.MatchAny(any=list(exclude_slots))))
        return m.Filter(must=must, must_not=must_not or None)

    def _kinds(self, types: Sequence[str] | None, slots: Sequence[str] | None) -> list[Any]:
        m = self._m
        conds = []
        if types is not None:
            conds.append(m.FieldCondition(key="type", match=m.MatchAny(any=list(types))))
        if slots is not None:
            conds.append(m.FieldCondition(key="slot", match=m.MatchAny(any=list(slots))))
        return conds

    def write(self, memories: Sequence[Memory], vectors: Sequence[list[float] | None]) -> None:
        self.write_records([(mem.point_id, mem.to_payload(), v)
                            for mem, v in zip(memories, vectors, strict=True)])

    def write_records(self, records: Sequence[Record]) -> None:
        m = self._m
        points = [m.PointStruct(id=pid, payload=p,
                                vector=record_vectors(p, v, self.lexical, m.SparseVector))
                  for pid, p, v in records if v is not None]
        if points:
            self._client.upsert(self.collection, points=points, wait=True)
        for pid, payload, v in records:
            if v is None:
                self._client.overwrite_payload(self.collection, payload=payload,
                                               points=[pid], wait=True)

    def search_turns(self, scope: Scope, k: int, *, vector: list[float] | None = None,
                     sparse: lexical.Sparse | None = None, window: TurnWindow | None = None,
                     ) -> list[tuple[dict[str, Any], float]]:
        """As EdgeStore.search_turns: IDF over the user's own turns (a corpus filter), so
        no other user's words move this one's ranking."""
        m = self._m
        own = Scope(scope.tenant_id, scope.user_id)
        where = self._filter(own, (TURN_STATUS,), self._window(window))
        if vector is not None:
            hits = self._client.query_points(self.collection, query=vector, limit=k,
                                             with_payload=True, query_filter=where).points
        elif sparse and self.lexical:
            hits = self._client.query_points(
                self.collection, query=m.SparseVector(indices=list(sparse.indices),
                                                      values=list(sparse.values)),
                using=SPARSE, limit=k, with_payload=True, query_filter=where,
                search_params=m.SearchParams(idf=m.IdfCorpusParams(
                    corpus=self._filter(own, (TURN_STATUS,))))).points
        else:
            return []
        return [(dict(h.payload or {}), float(h.score)) for h in hits]

    def _window(self, window: TurnWindow | None) -> list[Any]:
        m = self._m
        if window is None:
            return []
        conds: list[Any] = []
        if window.session_id is not None:
            conds.append(m.FieldCondition(key="session_id",
                                          match=m.MatchValue(value=window.session_id)))
        if window.since is not None or window.until is not None:
            conds.append(m.FieldCondition(key="ts", range=m.Range(gte=window.since,
                                                                  lt=window.until)))
        return conds

    def versions(self, scope: Scope, *, memory_ids: Sequence[str] = (),
                 message_ids: Sequence[str] = ()) -> list[Memory]:
        m = self._m
        should: list[Any] = [
            m.FieldCondition(key=key, match=m.MatchAny(any=list(dict.fromkeys(ids))))
            for key, ids in (("memory_id", memory_ids), (LINEAGE, message_ids)) if ids]
        if not should:
            return []
        where = self._filter(Scope(scope.tenant_id, scope.user_id), None,
                             [m.Filter(should=should)])
        found: list[Memory] = []
        offset: Any = None
        while True:
            records, offset = self._client.scroll(self.collection, scroll_filter=where,
                                                  limit=256, offset=offset, with_payload=True)
            found += [Memory.from_payload(r.payload) for r in records]
            if offset is None:
                return found

    def sweep_turns(self, before: float) -> int:
        m = self._m
        old = m.Filter(must=[m.FieldCondition(key="status", match=m.MatchValue(value=TURN_STATUS)),
                             m.FieldCondition(key="ts", range=m.Range(lt=before))])
        n = int(self._client.count(self.collection, count_filter=old, exact=True).count)
        if n:
            self._client.delete(self.collection, points_selector=m.FilterSelector(filter=old),
                                wait=True)
        return n

    def search(self, scope: Scope, vector: list[float], k: int,
               statuses: Sequence[str] = ("active",), *, types: Sequence[str] | None = None,
               exclude_slots: Sequence[str] = ()) -> list[tuple[Memory, float]]:
        where = self._filter(scope, statuses, self._kinds(types, None), exclude_slots)
        hits = self._client.query_points(
            self.collection, query=vector, limit=k, with_payload=True,
            query_filter=where).points
        return [(Memory.from_payload(h.payload), float(h.score)) for h in hits]

    def list(self, scope: Scope, statuses: Sequence[str] | None = ("active",),
             limit: int = 10_000, *, types: Sequence[str] | None = None,
             slots: Sequence[str] | None = None) -> list[Memory]:
        where = self._filter(scope, statuses, self._kinds(types, slots))
        records, _ = self._client.scroll(self.collection, scroll_filter=where, limit=limit,
                                         with_payload=True)
        return [Memory.from_payload(r.payload) for r in records]

    def op_applied(self, scope: Scope, op_id: str) -> bool:
        m = self._m
        for key in APPLIED_BY:
            cond = m.FieldCondition(key=key, match=m.MatchValue(value=op_id))
            n = self._client.count(self.collection, count_filter=self._filter(
                scope, None, [cond], hidden=NOT_OPS), exact=True).count
            if n:
                return True
        return False

    def ops_applied(self, scope: Scope, op_ids: Sequence[str]) -> set[str]:
        return {i for i in dict.fromkeys(op_ids) if self.op_applied(scope, i)}

    def live_versions(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, int]:
        if not memory_ids:
            return {}
        m = self._m
        cond = m.FieldCondition(key="memory_id", match=m.MatchAny(any=list(memory_ids)))
        records, _ = self._client.scroll(
            self.collection, scroll_filter=self._filter(scope, ["active"], [cond]),
            limit=10 * len(memory_ids) + 10, with_payload=True)
        return live_from(r.payload for r in records)

    def cursor(self, scope: Scope) -> Cursor | None:
        found = self._client.retrieve(
            self.collection, ids=[cursor_point_id(scope.tenant_id, scope.user_id)],
            with_payload=True, with_vectors=False)
        return cursor_from(scope, (r.payload for r in found))

    def set_cursor(self, scope: Scope, cursor: Cursor,
                   published: Sequence[str] | None = None) -> None:
        m = self._m
        points = [m.PointStruct(id=cursor_point_id(scope.tenant_id, scope.user_id),
                                vector=unit_vector(self._dim),
                                payload=cursor_payload(scope, cursor))]
        if published is not None:
            kept = Published(cursor, tuple(published))
            points.append(m.PointStruct(id=published_point_id(scope.tenant_id, scope.user_id),
                                        vector=unit_vector(self._dim),
                                        payload=published_payload(scope, kept)))
        self._client.upsert(self.collection, points=points, wait=True)

    def published(self, scope: Scope) -> Published | None:
        found = self._client.retrieve(
            self.collection, ids=[published_point_id(scope.tenant_id, scope.user_id)],
            with_payload=True, with_vectors=False)
        return published_from(scope, (r.payload for r in found))

    def scan(self, tenant_id: str | None = None, user_id: str | None = None, *,
             vectors: bool = False, page: int = 1024) -> Iterator[Record]:
        m = self._m
        must: list[Any] = [m.FieldCondition(key=k, match=m.MatchValue(value=v))
                           for k, v in (("tenant_id", tenant_id), ("user_id", user_id))
                           if v is not None]
        where = m.Filter(must=must) if must else None
        offset: Any = None
        while True:
            records, offset = self._client.scroll(
                self.collection, scroll_filter=where, limit=page, offset=offset,
                with_payload=True, with_vectors=vectors)
            for r in records:
                vec = r.vector.get("") if isinstance(r.vector, dict) else r.vector
                vec = vec if isinstance(vec, list) else None
                yield str(r.id), dict(r.payload or {}), vec
            if offset is None:
                return

    def delete_records(self, point_ids: Sequence[str]) -> None:
        if point_ids:
            self._client.delete(self.collection, points_selector=self._m.PointIdsList(
                points=list(point_ids)), wait=True)

    def erase(self, scope: Scope) -> int:
        m = self._m
        own = Scope(scope.tenant_id, scope.user_id)  # never the global user's
        n = self._client.count(self.collection, count_filter=self._filter(own, None),
                               exact=True).count
        everything = m.Filter(
            must=[m.FieldCondition(key="tenant_id", match=m.MatchValue(value=own.tenant_id)),
                  m.FieldCondition(key="user_id", match=m.MatchValue(value=own.user_id))],
            must_not=[m.FieldCondition(key="status", match=m.MatchValue(value=CURSOR_STATUS))])
        self._client.delete(self.collection, points_selector=m.FilterSelector(filter=everything),
                            wait=True)
        return int(n)

    def access_stats(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, AccessStats]:
        if not memory_ids:
            return {}
        ids = [access_point_id(scope.tenant_id, scope.user_id, mid) for mid in memory_ids]
        found = self._client.retrieve(self.collection, ids=ids, with_payload=True,
                                      with_vectors=False)
        return access_from(scope, (r.payload for r in found))

    def put_access(self, scope: Scope, stats: Sequence[AccessStats]) -> None:
        m = self._m
        points = [m.PointStruct(id=access_point_id(scope.tenant_id, scope.user_id, s.memory_id),
                                vector=unit_vector(self._dim),
                                payload=access_payload(scope, s)) for s in stats]
        if points:
            self._client.upsert(self.collection, points=points, wait=True)

    def count(self) -> int:
        m = self._m
        records = m.Filter(must_not=[m.FieldCondition(
            key="status", match=m.MatchAny(any=list(HIDDEN_STATUSES)))])
        return int(self._client.count(self.collection, count_filter=records, exact=True).count)

    def close(self) -> None:
        self._client.close()
