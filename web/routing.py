"""Any worker answers any request: a request for a user whose partition another worker owns
is forwarded to that worker (the cluster map: :mod:`streams.cluster`, verified members
only), and answered from a warm standby shard here when the owner cannot be reached.

- **Checked first**: the key (401, under the failed-login limit: 429), the path ids (400)
  and the tenant (403) are checked where the request arrives, before anything is sent
  anywhere; a body is read to its end (chunked too) or refused at the limit (413).
- **Forwarded** (only with the cluster secret): method, path, query and body go to the
  owner's advertised URL (its scheme, host and port; the path and query re-encoded from the
  parsed request, never the raw target, which must be a path: :mod:`.forwarding`) without
  the caller's key: with ``X-Memstream-Forwarded`` (this
  worker), ``X-Memstream-Principal`` (whom the key opened), the write's ``Idempotency-Key``
  and an ``X-Memstream-Credential`` signed over all of them (:mod:`.forwarding`). A
  forwarded request is never forwarded again. Only a JSON answer is relayed (with its
  status, ``Retry-After`` and ``X-Memstream-Served-By``, the worker that answered); any
  other answer, a 401 (the owner refused the credential) or 502-504 counts as the owner
  not answering. The forward waits longer than the longest ``wait_s`` a write may ask for.
- **Standby**: when the owner does not answer (connection refused, timeout, 502-504 as it
  restarts), a read (GET, search, context) of a partition this worker keeps a standby of is
  served from the standby shard, marked ``X-Memstream-Standby: 1``: its memories are the
  committed changes up to a second or so ago, and its context has no short-term window
  (the window lives with the owner's ingest stage). A worker without a standby of it asks
  the standby workers the map names (``X-Memstream-Standby-Read``, signed like any forward).
  Writes and tool calls are never served from a standby: the caller gets 503 and retries
  with the same ``Idempotency-Key`` (the client does), which the owner takes once.
- Requests for the tenant as a whole, health, metrics and the inspector are served here,
  and so are the HTTP way in's writes (:data:`memstream.web.http_ingest.LOCAL`): any worker
  produces a user's messages, the partitioner puts them on the user's partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import ErrorCode, Principal, ToolCallRequest
from memstream.contract.http_api.history import CorrectionRequest
from memstream.core.errors import describe
from memstream.memory.store.partitioned import ShardNotHere, partition_of, standby_reads
from memstream.streams.cluster import Cluster
from memstream.web.forwarding import (
    FORWARDED,
    STANDBY_ASKED,
    STANDBY_READ,
    BadOwnerURL,
    ForwardGate,
    client_ssl,
    forward_target,
    forward_url,
    outbound,
)
from memstream.web.http_base import DEPS, ApiError
from memstream.web.http_checks import FORWARDED_BY, identified, read_body
from memstream.web.http_ingest import LOCAL

if TYPE_CHECKING:  # the worker's pipeline (its declared parts), not imported at run time
    from memstream.streams.pipeline import Pipeline

__all__ = ["FORWARDED", "SERVED_BY", "STANDBY", "STANDBY_READ", "Router", "cluster_status"]

log = logging.getLogger(__name__)
SERVED_BY = "X-Memstream-Served-By"
STANDBY = "X-Memstream-Standby"
FORWARD_MARGIN_S = 10.0
CONNECT_TIMEOUT_S = 2.0
READS = {paths.SEARCH, paths.CONTEXT}  # POST routes that only read
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def longest_wait_s() -> float:
    """The longest ``wait_s`` a write may ask the owner to hold its answer (the models')."""
    limits = [m.le for model in (ToolCallRequest, CorrectionRequest)
              for m in model.model_fields["wait_s"].metadata if getattr(m, "le", None)]
    return float(max(limits))


FORWARD_TIMEOUT_S = longest_wait_s() + FORWARD_MARGIN_S


def relayable(status: int, content_type: str) -> bool:
    """Is the owner's answer one to hand the caller (else: the owner did not answer)?"""
    return status not in (401, 502, 503, 504) and content_type == "application/json"


class Router:
    """Where each user's requests are served (see the module doc). Without ``secret`` (the
    cluster secret) nothing is forwarded: every request is served here."""

    def __init__(self, cluster: Cluster, partitions: int, store: Any = None, *,
                 secret: str | None = None, ca: Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cluster = cluster
        self.partitions = partitions
        self.store = store  # a memory.store.partitioned.PartitionedStore: its standby shards
        self.secret = secret
        self.gate = ForwardGate(secret, cluster.me.worker_id, clock) if secret else None
        self.ca = ca
        self.clock = clock
        self.timeout = aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S,
                                             connect=CONNECT_TIMEOUT_S)
        self.session: aiohttp.ClientSession | None = None
        self.forwarded = 0
        self.standby_served = 0
        self.failed = 0

    def owner(self, tenant: str, user: str) -> tuple[int, str | None, str | None]:
        """(partition, owner worker id, its URL); no owner: not known (served here)."""
        partition = partition_of(tenant, user, self.partitions)
        the_map = self.cluster.routing()
        if the_map is None or not self.secret:
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
        if tenant is None or user is None or self._is_local(request):
            return await handler(request)
        if FORWARDED_BY in request:  # verified by web.forwarding; never forwarded again
            if request[STANDBY_ASKED] and self._is_read(request):
                return await self._from_standby(request, handler, partition_of(
                    tenant, user, self.partitions))
            return await handler(request)
        principal, _ = identified(request, "tenant", "user")  # 401 / 400 / 403 here
        partition, owner, url = self.owner(tenant, user)
        if owner is None or owner == self.cluster.me.worker_id or not url:
            response = await handler(request)
            response.headers[SERVED_BY] = self.cluster.me.worker_id
            return response
        body = await read_body(request, request.app[DEPS].max_body_bytes)  # 413 here
        answer = await self._forward(request, body, principal, url, owner)
        if answer is not None:
            return answer
        if self._is_read(request):
            if self.has_standby(partition):
                return await self._from_standby(request, handler, partition)
            for worker, where in self._standbys(partition):  # a standby elsewhere
                answer = await self._forward(request, body, principal, where, worker, True)
                if answer is not None:
                    return answer
        raise ShardNotHere(partition, f"owned by {owner}, which does not answer")

    @staticmethod
    def _is_local(request: web.Request) -> bool:
        route = request.match_info.route.resource
        return route is not None and route.canonical in LOCAL

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

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            connector = aiohttp.TCPConnector(ssl=client_ssl(self.ca))
            self.session = aiohttp.ClientSession(timeout=self.timeout, connector=connector)
        return self.session

    async def _forward(self, request: web.Request, body: bytes, principal: Principal,
                       url: str, owner: str, standby: bool = False) -> web.Response | None:
        """The owner's answer, or None when it cannot give one now (it does not answer).
        An owner URL that is not one to forward to is 503, never "down": no standby read
        stands in for a request the map cannot send."""
        assert self.secret is not None  # owner() names no owner without it
        target = forward_target(request)
        try:
            where = forward_url(url, target)
        except BadOwnerURL as exc:
            log.warning("forwarding to %s: its advertised URL is not usable (%s)", owner,
                        describe(exc))
            if standby:  # another standby may be asked
                return None
            raise ApiError(503, ErrorCode.UNAVAILABLE, "this user's worker has no usable "
                           "URL; retry later") from None
        headers = outbound(self.secret, self.cluster.me.worker_id, request, body, principal,
                           standby, self.clock(), owner, target.raw_path_qs)
        try:
            async with self._session().request(
                    request.method, where, headers=headers, data=body or None,
                    allow_redirects=False) as resp:
                payload = await resp.read()
                if not relayable(resp.status, resp.content_type):
                    self.failed += 1
                    log.info("forwarding to %s: answer %d %s not relayed", owner,
                             resp.status, resp.content_type)
                    return None
                self.forwarded += 1
                out = web.Response(status=resp.status, body=payload,
                                   content_type="application/json")
                if "Retry-After" in resp.headers:
                    out.headers["Retry-After"] = resp.headers["Retry-After"]
                out.headers[SERVED_BY] = resp.headers.get(SERVED_BY, owner)
                if STANDBY in resp.headers:
                    out.headers[STANDBY] = resp.headers[STANDBY]
                return out
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.failed += 1
            log.info("forwarding to %s (%s) failed: %s", owner, url, type(exc).__name__)
            return None


def cluster_status(p: Pipeline, router: Router | None) -> dict[str, Any]:
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
