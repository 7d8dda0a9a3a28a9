"""The embedded default store: the Qdrant engine in-process (qdrant-edge-py 0.9.0)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
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


class EdgeStore:
    """Persistent on disk at ``path``; one process owns a path."""

    def __init__(self, path: Path, dim: int) -> None:
        import qdrant_edge as qe

        self._qe = qe
        self._lock = threading.Lock()  # the shard is shared by the agent's threads
        self._dim = dim
        path.mkdir(parents=True, exist_ok=True)
        shard_dir = path / "shard"
        try:
            if shard_dir.exists() and any(shard_dir.iterdir()):
                self._shard = qe.EdgeShard.load(str(shard_dir))
            else:
                config = qe.EdgeConfig(vectors=qe.EdgeVectorParams(
                    size=dim, distance=qe.Distance.Cosine))
                self._shard = qe.EdgeShard.create(str(shard_dir), config)
                for name in INDEXED_KEYWORDS:
                    self._shard.update(qe.UpdateOperation.create_field_index(
                        name, qe.PayloadSchemaType.Keyword))
        except Exception as exc:
            raise StoreError(f"cannot open the Qdrant Edge shard at {shard_dir}: {exc}") from exc

    def _filter(self, scope: Scope, statuses: Sequence[str] | None,
                extra: list[Any] | None = None) -> Any:
        qe = self._qe
        must = [
            qe.FieldCondition(key="tenant_id", match=qe.MatchValue(scope.tenant_id)),
            qe.FieldCondition(key="user_id", match=qe.MatchAny(scope.users())),
        ]
        if statuses is not None:
            must.append(qe.FieldCondition(key="status", match=qe.MatchAny(list(statuses))))
            return qe.Filter(must=must + (extra or []))
        cursor = qe.FieldCondition(key="status", match=qe.MatchValue(CURSOR_STATUS))
        return qe.Filter(must=must + (extra or []), must_not=[cursor])

    def write(self, memories: Sequence[Memory], vectors: Sequence[list[float] | None]) -> None:
        qe = self._qe
        points = [qe.Point(m.point_id, v, m.to_payload())
                  for m, v in zip(memories, vectors, strict=True) if v is not None]
        with self._lock:
            if points:
                self._shard.update(qe.UpdateOperation.upsert_points(points))
            for m, v in zip(memories, vectors, strict=True):
                if v is None:
                    self._shard.update(qe.UpdateOperation.set_payload([m.point_id],
                                                                      m.to_payload()))
            # No flush per write: updates go through the shard's write-ahead log, and the
            # memory-change topic can rebuild the store anyway. close() flushes.

    def search(self, scope: Scope, vector: list[float], k: int,
               statuses: Sequence[str] = ("active",)) -> list[tuple[Memory, float]]:
        qe = self._qe
        request = qe.QueryRequest(limit=k, query=qe.Query.Nearest(vector),
                                  filter=self._filter(scope, statuses), with_payload=True)
        with self._lock:
            hits = self._shard.query(request)
        return [(Memory.from_payload(h.payload or {}), float(h.score)) for h in hits]

    def list(self, scope: Scope, statuses: Sequence[str] | None = ("active",),
             limit: int = 10_000) -> list[Memory]:
        qe = self._qe
        with self._lock:
            records, _ = self._shard.scroll(qe.ScrollRequest(
                limit=limit, filter=self._filter(scope, statuses), with_payload=True))
        return [Memory.from_payload(r.payload or {}) for r in records]

    def op_applied(self, scope: Scope, op_id: str) -> bool:
        qe = self._qe
        for key in ("source.op_id", "extra.closed_by"):
            cond = qe.FieldCondition(key=key, match=qe.MatchValue(op_id))
            with self._lock:
                n = self._shard.count(qe.CountRequest(filter=self._filter(scope, None, [cond])))
            if n:
                return True
        return False

    def live_versions(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, int]:
        if not memory_ids:
            return {}
        qe = self._qe
        cond = qe.FieldCondition(key="memory_id", match=qe.MatchAny(list(memory_ids)))
        with self._lock:
            records, _ = self._shard.scroll(qe.ScrollRequest(
                limit=10 * len(memory_ids) + 10, with_payload=True,
                filter=self._filter(scope, ["active"], [cond])))
        return live_from(r.payload for r in records)

    def cursor(self, scope: Scope) -> Cursor | None:
        with self._lock:
            found = self._shard.retrieve([cursor_point_id(scope.tenant_id, scope.user_id)],
                                         True, False)
        return cursor_from(scope, (r.payload for r in found))

    def set_cursor(self, scope: Scope, cursor: Cursor) -> None:
        qe = self._qe
        point = qe.Point(cursor_point_id(scope.tenant_id, scope.user_id),
                         unit_vector(self._dim), cursor_payload(scope, cursor))
        with self._lock:
            self._shard.update(qe.UpdateOperation.upsert_points([point]))

    def close(self) -> None:
        with self._lock:
            self._shard.flush()
            self._shard.close()
