"""``memstream search``: the worker's API through :mod:`memstream.client` when it answers,
else the store directly (the worker must not be running on it then)."""

from __future__ import annotations

from typing import Any

from memstream.core.settings import Settings


def search_http(settings: Settings, tenant: str, user: str, query: str, k: int,
                base_url: str | None = None, api_key: str | None = None) -> dict[str, Any] | None:
    """The API's answer, or None when no key is known or no worker answers."""
    from memstream.client import MemoryClient, MemstreamAPIError, MemstreamConnectionError

    key = api_key or (settings.admin_key.get_secret_value() if settings.admin_key else None)
    if key is None:
        return None
    url = base_url or f"http://{settings.web_host}:{settings.web_port}"
    client = MemoryClient(url, key, tenant_id=tenant)
    try:
        found = client.search(query, user_id=user, limit=k, record_hits=False)
    except MemstreamAPIError as exc:
        return {"error": exc.code, "status": exc.status, "message": exc.message}
    except MemstreamConnectionError:  # the client's (httpx's never reached here)
        return None
    finally:
        client.close()
    return {"tenant": tenant, "user": user, "query": query, **found.model_dump(mode="json")}


def search_local(settings: Settings, tenant: str, user: str, query: str,
                 k: int) -> dict[str, Any]:
    import time

    from memstream.memory import retrieval
    from memstream.memory.services import build_embedder, build_store, weights

    embedder = build_embedder(settings)
    store = build_store(settings, embedder.dim, offline=True)
    try:
        found = retrieval.recall(store, embedder, retrieval.Query(tenant, user, query, k),
                                 time.time(), weights(settings), settings.retrieval_candidates)
    finally:
        store.close()
    return {"tenant": tenant, "user": user, "query": query,
            "memories": [retrieval.scored_dict(s) for s in found.scored],
            "procedural": [retrieval.memory_dict(m) for m in found.procedural]}
