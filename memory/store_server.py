"""A Qdrant server through qdrant-client (multi-worker deployments; ":memory:" in tests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memstream.memory.fencing import Cursor
from memstream.memory.model import Memory
from memstream.memory.store import (
    CURSOR_STATUS,
    INDEXED_KEYWORDS,
    Scope,
    StoreError,
    cursor_from,
    cursor_payload,
    cursor_point_id,
    live_from,
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
                client.create_collection(collection, vectors_config=models.VectorParams(
                    size=dim, distance=models.Distance.COSINE))
                for name in INDEXED_KEYWORDS:
                    client.create_payload_index(collection, name,
                                                models.PayloadSchemaType.KEYWORD)
        except Exception as exc:
            raise StoreError(f"cannot prepare collection {collection!r}: {exc}") from exc

    @classmethod
    def connect(cls, url: str, api_key: str | None, collection: str, dim: int) -> ServerStore:
        from qdrant_client import QdrantClient

        return cls(collection, dim, client=QdrantClient(url=url, api_key=api_key))

    def _filter(self, scope: Scope, statuses: Sequence[str] | None,
                extra: list[Any] | None = None) -> Any:
        m = self._m
        must: list[Any] = [
            m.FieldCondition(key="tenant_id", match=m.MatchValue(value=scope.tenant_id)),
            m.FieldCondition(key="user_id", match=m.MatchAny(any=scope.users())),
        ]
        if statuses is not None:
            must.append(m.FieldCondition(key="status", match=m.MatchAny(any=list(statuses))))
            return m.Filter(must=must + (extra or []))
        cursor = m.FieldCondition(key="status", match=m.MatchValue(value=CURSOR_STATUS))
        return m.Filter(must=must + (extra or []), must_not=[cursor])

    def write(self, memories: Sequence[Memory], vectors: Sequence[list[float] | None]) -> None:
        m = self._m
        points = [m.PointStruct(id=mem.point_id, vector=v, payload=mem.to_payload())
                  for mem, v in zip(memories, vectors, strict=True) if v is not None]
        if points:
            self._client.upsert(self.collection, points=points, wait=True)
        for mem, v in zip(memories, vectors, strict=True):
            if v is None:
                self._client.set_payload(self.collection, payload=mem.to_payload(),
                                         points=[mem.point_id], wait=True)

    def search(self, scope: Scope, vector: list[float], k: int,
               statuses: Sequence[str] = ("active",)) -> list[tuple[Memory, float]]:
        hits = self._client.query_points(
            self.collection, query=vector, limit=k, with_payload=True,
            query_filter=self._filter(scope, statuses)).points
        return [(Memory.from_payload(h.payload), float(h.score)) for h in hits]

    def list(self, scope: Scope, statuses: Sequence[str] | None = ("active",),
             limit: int = 10_000) -> list[Memory]:
        records, _ = self._client.scroll(self.collection, scroll_filter=self._filter(
            scope, statuses), limit=limit, with_payload=True)
        return [Memory.from_payload(r.payload) for r in records]

    def op_applied(self, scope: Scope, op_id: str) -> bool:
        m = self._m
        for key in ("source.op_id", "extra.closed_by"):
            cond = m.FieldCondition(key=key, match=m.MatchValue(value=op_id))
            n = self._client.count(self.collection, count_filter=self._filter(
                scope, None, [cond]), exact=True).count
            if n:
                return True
        return False

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

    def set_cursor(self, scope: Scope, cursor: Cursor) -> None:
        m = self._m
        point = m.PointStruct(id=cursor_point_id(scope.tenant_id, scope.user_id),
                              vector=unit_vector(self._dim),
                              payload=cursor_payload(scope, cursor))
        self._client.upsert(self.collection, points=[point], wait=True)

    def close(self) -> None:
        self._client.close()
