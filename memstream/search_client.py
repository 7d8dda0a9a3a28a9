"""``memstream search``: the worker's HTTP view when it answers, else the store directly."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from memstream.settings import Settings


def search_http(settings: Settings, tenant: str, user: str, query: str,
                k: int) -> dict[str, Any] | None:
    if settings.api_key is None:
        return None
    params = urllib.parse.urlencode({"tenant": tenant, "user": user, "q": query, "k": k})
    req = urllib.request.Request(
        f"http://127.0.0.1:{settings.web_port}/v1/memories/search?{params}",
        headers={"X-API-Key": settings.api_key.get_secret_value()})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        return {"error": f"HTTP {exc.code}", "detail": exc.read().decode(errors="replace")}
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def search_local(settings: Settings, tenant: str, user: str, query: str,
                 k: int) -> dict[str, Any]:
    from memstream.memory.retrieval import search
    from memstream.memory.services import build_embedder, build_store

    embedder = build_embedder(settings)
    store = build_store(settings, embedder.dim)
    try:
        hits = search(store, embedder, tenant, user, query, k)
    finally:
        store.close()
    return {"tenant": tenant, "user": user, "query": query,
            "memories": [h.as_dict() for h in hits]}
