"""HTTP views served by the worker (Faust web): key-protected, scoped to one user.

GET /v1/memories/search?tenant=T&user=U&q=...&k=5   header X-API-Key: <MEMSTREAM_API_KEY>
GET /v1/memories?tenant=T&user=U                     (the user's live memories)
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from memstream.memory.retrieval import Hit, search
from memstream.memory.store import Scope
from memstream.streams.app import Pipeline
from memstream.topics.schemas import ID_PATTERN


def _authorised(p: Pipeline, request: Any) -> bool:
    expected = p.settings.api_key
    given = request.headers.get("X-API-Key", "")
    return expected is not None and hmac.compare_digest(given, expected.get_secret_value())


def _refused(p: Pipeline, web: Any, request: Any) -> Any | None:
    if not _authorised(p, request):
        return web.json({"error": "missing or wrong X-API-Key"}, status=401)
    q = request.query
    if not (ID_PATTERN.fullmatch(q.get("tenant", "")) and ID_PATTERN.fullmatch(q.get("user", ""))):
        return web.json({"error": "tenant and user must be valid ids"}, status=400)
    return None


def register(p: Pipeline) -> None:
    @p.app.page("/v1/memories")
    async def memories_list(web: Any, request: Any) -> Any:
        if (refusal := _refused(p, web, request)) is not None:
            return refusal
        tenant, user = request.query["tenant"], request.query["user"]
        found = await asyncio.to_thread(p.services.store.list, Scope(tenant, user))
        found.sort(key=lambda m: m.created_at)
        return web.json({"tenant": tenant, "user": user,
                         "memories": [Hit(m, None).as_dict() for m in found]})

    @p.app.page("/v1/memories/search")
    async def memories_search(web: Any, request: Any) -> Any:
        if (refusal := _refused(p, web, request)) is not None:
            return refusal
        q = request.query
        tenant, user, text = q["tenant"], q["user"], q.get("q", "")
        try:
            k = max(1, min(int(q.get("k", p.settings.retrieval_k)), 50))
        except ValueError:
            return web.json({"error": "k must be an integer"}, status=400)
        s = p.services
        hits = await asyncio.to_thread(search, s.store, s.embedder, tenant, user, text, k)
        return web.json({"tenant": tenant, "user": user, "query": text,
                         "memories": [h.as_dict() for h in hits]})
