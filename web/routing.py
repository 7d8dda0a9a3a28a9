"""Any worker answers any request: a request for a user whose partition another worker owns
is forwarded to that worker (the cluster map: :mod:`streams.cluster`), and answered from a
warm standby shard here when the owner cannot be reached.

- **Forwarded**: method, path, query, body and the caller's ``Authorization`` go to the
  owner's advertised URL with ``X-Memstream-Forwarded`` (a forwarded request is never
  forwarded again: no loops, whatever two workers' maps say). The owner's answer is
  returned as it is, with ``X-Memstream-Served-By`` naming the worker that answered.
- **Standby**: when the owner does not answer (connection refused, timeout, 502-504 as it
  restarts), a read (GET, search, context) of a partition this worker keeps a standby of is
  served from the standby shard, marked ``X-Memstream-Standby: 1``: its memories are the
  committed changes up to a second or so ago, and its context has no short-term window
  (the window lives with the owner's ingest stage). A worker without a standby of it asks
  the standby workers the map names (``X-Memstream-Standby-Read``). Writes and tool calls
  are never served from a standby: the caller gets 503 and retries (the client fails over).
- Requests for the tenant as a whole, health, metrics and the inspector are served here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from memstream.memory.shards import ShardNotHere, partition_of, standby_reads
from memstream.streams.cluster import Cluster
from memstream.web.http_base import DEPS
from memstream.web.http_checks import BODY_READ
from memstream.web.models import paths

log = logging.getLogger(__name__)
FORWARDED = "X-Memstream-Forwarded"
SERVED_BY = "X-Memstream-Served-By"
STANDBY = "X-Memstream-Standby"
STANDBY_READ = "X-Memstream-Standby-Read"  # a forwarded read a standby shard may answer
FORWARD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 2.0
READS = {paths.SEARCH, paths.CONTEXT}  # POST routes that only read
PASSED_HEADERS = ("Authorization", "X-API-Key", "Content-Type", "Accept")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Router:
    """Where each user's requests are served (see the module doc)."""

    def __init__(self, cluster: Cluster, partitions: int, store: Any = None) -> None:
        self.cluster = cluster
        self.partitions = partitions
        self.store = store  # a memory.shards.PartitionedStore: its standby shards
        self.session: aiohttp.ClientSession | None = None
        self.forwarded = 0
        self.standby_served = 0
        self.failed = 0

    def owner(self, tenant: str, user: str) -> tuple[int, str | None, str | None]:
        """(partition, owner worker id, its URL); no owner: not known (served here)."""
        partition = partition_of(tenant, user, self.partitions)
        the_map = self.cluster.routing()
        if the_map is None:
            return partition, None, None
        owner = the_map.owners.get(partition)
        return partition, owner, the_map.workers.get(owner) if owner else None

    def has_standby(self, partition: int) -> bool:
        return self.store is not None and partition in getattr(self.store, "standby", {})

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        tenant = request.match_info.get("tenant")
        user = request.match_info.get("user")
        if tenant is None or user is None:
            return await handler(request)
        partition, owner, url = self.owner(tenant, user)
        if FORWARDED in request.headers:  # never forwarded again
            if request.headers.get(STANDBY_READ) == "1" and self._is_read(request):
                return await self._from_standby(request, handler, partition)
            return await handler(request)
        if owner is None or owner == self.cluster.me.worker_id or not url:
            response = await handler(request)
            response.headers[SERVED_BY] = self.cluster.me.worker_id
            return response
        limit = request.app[DEPS].max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return await handler(request)  # refused here: key first (401), then size (413)
        request[BODY_READ] = await request.content.read(limit + 1)  # the handler's, too
        if len(request[BODY_READ]) > limit:
            return await handler(request)
        answer = await self._forward(request, url, owner)
        if answer is not None:
            return answer
        if self._is_read(request):
            if self.has_standby(partition):
                return await self._from_standby(request, handler, partition)
            for worker, where in self._standbys(partition):  # a standby elsewhere
                answer = await self._forward(request, where, worker, {STANDBY_READ: "1"})
                if answer is not None:
                    return answer
        raise ShardNotHere(partition, f"owned by {owner}, which does not answer")

    @staticmethod
    def _is_read(request: web.Request) -> bool:
        route = request.match_info.route.resource
        return request.method == "GET" or (route is not None and route.canonical in READS)

    def _standbys(self, partition: int) -> list[tuple[str, str]]:
        """The other workers the map names standbys of ``partition``, with their URLs."""
        the_map = self.cluster.routing()
        if the_map is None:
            return []
        return [(w, the_map.workers[w]) for w in the_map.standbys.get(partition, ())
                if w != self.cluster.me.worker_id and the_map.workers.get(w)]

    async def _from_standby(self, request: web.Request, handler: Handler,
                            partition: int) -> web.StreamResponse:
        """Answered here, a standby shard allowed (the owned one first, if it is here)."""
        owned = partition in getattr(self.store, "owned", {})
        if not owned:
            self.standby_served += 1
        with standby_reads():
            response = await handler(request)
        if not owned:
            response.headers[STANDBY] = "1"
        response.headers[SERVED_BY] = self.cluster.me.worker_id
        return response

    async def _forward(self, request: web.Request, url: str, owner: str,
                       extra: dict[str, str] | None = None) -> web.Response | None:
        """The owner's answer, or None when it cannot give one now."""
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                total=FORWARD_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        headers = {h: request.headers[h] for h in PASSED_HEADERS if h in request.headers}
        headers[FORWARDED] = self.cluster.me.worker_id
        headers.update(extra or {})
        body = request[BODY_READ]
        try:
            async with self.session.request(request.method, url + str(request.rel_url),
                                            headers=headers, data=body or None) as resp:
                payload = await resp.read()
                if resp.status in (502, 503, 504):
                    self.failed += 1
                    return None
                self.forwarded += 1
                out = web.Response(status=resp.status, body=payload)
                for name in ("Content-Type", "Retry-After", "WWW-Authenticate"):
                    if name in resp.headers:
                        out.headers[name] = resp.headers[name]
                out.headers[SERVED_BY] = resp.headers.get(SERVED_BY, owner)
                if STANDBY in resp.headers:
                    out.headers[STANDBY] = resp.headers[STANDBY]
                return out
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.failed += 1
            log.info("forwarding to %s (%s) failed: %s", owner, url, type(exc).__name__)
            return None


def cluster_status(p: Any, router: Router | None) -> dict[str, Any]:
    """``GET /v1/cluster``: the map this worker routes with, its shards and its loops' lag."""
    cluster: Cluster | None = p.cluster
    the_map = cluster.routing() if cluster is not None else None
    store = p.services.store
    keeper, standbys = p.shards, p.standbys
    lag: dict[int, int] = {}
    for loop in p.loops:
        for (_, partition), n in loop.lags().items():
            lag[partition] = lag.get(partition, 0) + n
    shards: dict[str, str] = {}
    for partition in sorted(getattr(store, "owned", {})):
        shards[str(partition)] = "serving"
    for partition in sorted(getattr(store, "standby", {})):
        shards[str(partition)] = "standby"
    if keeper is not None:
        for partition in keeper.restoring:
            shards[str(partition)] = "restoring"
    if standbys is not None:
        for partition, behind in standbys.behind.items():
            if behind:
                shards[str(partition)] = "standby (restoring)"
    return {
        "worker": cluster.me.worker_id if cluster is not None else None,
        "url": cluster.me.url if cluster is not None else None,
        "workers": the_map.workers if the_map is not None else {},
        "partitions": {str(n): {"owner": the_map.owners.get(n),
                                "standbys": list(the_map.standbys.get(n, ()))}
                       for n in sorted(the_map.owners)} if the_map is not None else {},
        "groups_aligned": _aligned(cluster),
        "store": "partitioned" if keeper is not None else p.settings.store,
        "shards": shards,
        "restores": [{"partition": n, "changes": c, "seconds": round(sec, 3)}
                     for n, c, sec in (keeper.restores[-50:] if keeper is not None else [])],
        "lag": {str(n): v for n, v in sorted(lag.items())},
        "requests": {"forwarded": router.forwarded, "standby": router.standby_served,
                     "owner_unreachable": router.failed} if router is not None else {},
    }


def _aligned(cluster: Cluster | None) -> bool | None:
    """Do every stage group's maps give each partition the same owner (after a rebalance
    they do, once every group has joined)?"""
    if cluster is None or not cluster.maps:
        return None
    owners = [m.owners for m in cluster.maps.values()]
    return all(o == owners[0] for o in owners)
