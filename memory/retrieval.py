"""Minimal retrieval (SPEC §5, first cut): the top-k live memories of one user, plus the
global semantic scope, by cosine relevance, each with its timestamps. Full scoring
(recency, importance, hit recording) comes with the retrieval milestone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memstream.memory.embedding import Embedder
from memstream.memory.model import GLOBAL_USER, Memory
from memstream.memory.store import MemoryStore, Scope


@dataclass(frozen=True)
class Hit:
    memory: Memory
    relevance: float | None

    def as_dict(self) -> dict[str, Any]:
        m = self.memory
        score = None if self.relevance is None else round(self.relevance, 4)
        return {"memory_id": m.memory_id, "content": m.content, "type": m.type.value,
                "importance": m.importance, "score": score,
                "created_at": m.created_at, "updated_at": m.updated_at,
                "valid_from": m.valid_from, "version": m.version,
                "scope": "global" if m.user_id == GLOBAL_USER else "user"}


def search(store: MemoryStore, embedder: Embedder, tenant_id: str, user_id: str, query: str,
           k: int = 5) -> list[Hit]:
    if not query.strip():
        return []
    vector = embedder.embed([query])[0]
    scope = Scope(tenant_id, user_id, include_global=True)
    return [Hit(m, score) for m, score in store.search(scope, vector, k)]
