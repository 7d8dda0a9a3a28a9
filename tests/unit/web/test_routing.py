"""Any worker answers any request (memstream.web.routing): two in-process workers, A (the one
asked) and B (the owner of the user's partition), each the real HTTP app over a fake backend
that records which worker answered and whether it read from a standby."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestClient, TestServer
from prometheus_client import CollectorRegistry

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import (
    Accepted,
    ContextRequest,
    ContextResponse,
    ErrorCode,
    FeedbackRequest,
    MemoryPage,
    Principal,
    SearchRequest,
    SearchResponse,
    ToolCallRequest,
    ToolResult,
)
from memstream.core.cluster_auth import CREDENTIAL_HEADER, IDEMPOTENCY_KEY, forward_credential
from memstream.memory.store.partitioned import _STANDBY, PartitionedStore, partition_of
from memstream.streams.cluster import Cluster, ClusterMap, Worker
from memstream.web.forwarding import PRINCIPAL_HEADER, TO
from memstream.web.http import ApiError, build_http_app
from memstream.web.prometheus import METRICS, MetricsDeps
from memstream.web.routing import FORWARDED, SERVED_BY, STANDBY, STANDBY_READ, Router
from tests.unit.builders import (
    ADMIN_KEY,
    KEYS,
    SCOPED,
    SCOPED_IDS,
    TENANT_KEY,
    FakeAuthoriser,
    FakeBackend,
    bearer,
    error_of,
)

pytestmark = pytest.mark.unit

PARTITIONS = 8
TENANT = "acme"
SECRET = "cluster-secret-0123456789abcdef-0123"


def _user(prefix: str, taken: set[int]) -> str:
    """The first ``prefix-N`` whose partition is not in ``taken``."""
    return next(f"{prefix}-{i}" for i in range(1000)
                if partition_of(TENANT, f"{prefix}-{i}", PARTITIONS) not in taken)


USER_B = "ub-0"  # B owns this user's partition
PB = partition_of(TENANT, USER_B, PARTITIONS)
USER_A = _user("ua", {PB})  # A owns this one
PA = partition_of(TENANT, USER_A, PARTITIONS)
USER_FREE = _user("uf", {PA, PB})  # nobody in the map owns this one
PF = partition_of(TENANT, USER_FREE, PARTITIONS)


def at(route: str, user: str = USER_B, tenant: str = TENANT) -> str:
    return paths.fill(route, tenant=tenant, user=user)


READS = [s for s in SCOPED if s[3] in ("list_memories", "search", "context")]
READ_IDS = [s[1].removeprefix(paths.USER + "/") for s in READS]
STANDBY_READS = [pytest.param(*s, id=i) for s, i in zip(READS, READ_IDS, strict=True)]
WRITES = [s for s in SCOPED if s[3] in ("feedback", "execute_tool")]
WRITE_IDS = [s[1].removeprefix(paths.USER + "/") for s in WRITES]


class WorkerBackend(FakeBackend):
    """A fake backend whose answers name its worker, and which notes for every call whether
    standby reads were on (``memory.store.partitioned.standby_reads``)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.standby_flags: list[bool] = []
        self.ready_calls = 0

    def ready(self) -> bool:
        self.ready_calls += 1
        return super().ready()

    def _record(self, *call: Any) -> None:
        self.standby_flags.append(_STANDBY.get())
        super()._record(*call)

    def tools(self) -> list[dict[str, Any]]:
        self._record("tools")
        return [{"type": "function", "function": {"name": f"tool-of-{self.name}"}}]

    async def list_memories(self, tenant: str, user: str, *, limit: int, cursor: str | None,
                            status: str | None, type: str | None) -> MemoryPage:
        page = await super().list_memories(tenant, user, limit=limit, cursor=cursor,
                                           status=status, type=type)
        return page.model_copy(update={"next_cursor": f"next-{self.name}"})

    async def search(self, tenant: str, user: str, req: SearchRequest) -> SearchResponse:
        found = await super().search(tenant, user, req)
        return found.model_copy(update={"query_id": f"q-{self.name}"})

    async def context(self, tenant: str, user: str, req: ContextRequest) -> ContextResponse:
        found = await super().context(tenant, user, req)
        return found.model_copy(update={"query_id": f"q-{self.name}"})

    async def feedback(self, tenant: str, user: str, req: FeedbackRequest) -> Accepted:
        await super().feedback(tenant, user, req)
        return Accepted(id=f"f-{self.name}")

    async def execute_tool(self, tenant: str, user: str, req: ToolCallRequest,
                           principal: Principal,
                           idempotency_key: str | None = None) -> ToolResult:
        done = await super().execute_tool(tenant, user, req, principal, idempotency_key)
        return done.model_copy(update={"content": f"done by {self.name}"})

    def called(self) -> list[tuple[Any, ...]]:
        return [c[:3] for c in self.calls]


def the_map(url_a: str, url_b: str, owners: dict[int, str] | None = None) -> ClusterMap:
    return ClusterMap(workers={"A": url_a, "B": url_b},
                      owners={PB: "B", PA: "A"} if owners is None else owners)


def url_of(server: BaseTestServer) -> str:
    return f"http://{server.host}:{server.port}"


def with_cluster_route(app: web.Application, name: str) -> None:
    """``GET /v1/cluster`` answers ``{"worker": name}`` (the admin key opens it)."""

    async def refresh() -> None:
        return None

    app[METRICS] = MetricsDeps(CollectorRegistry(), None, lambda: None,  # type: ignore[arg-type, return-value]
                               refresh, cluster=lambda: {"worker": name})


def raw_app(status: int) -> web.Application:
    """A worker answering every request with ``status`` (a proxy's 502 / 504, say)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"code": "x", "message": f"{status}"}}, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


@dataclass
class Pair:
    client: TestClient  # talks to A
    a: WorkerBackend
    b: WorkerBackend
    router: Router  # A's
    cluster: Cluster  # A's
    b_server: TestServer | None
    b_seen: list[dict[str, str]] = field(default_factory=list)  # B's requests' headers


@asynccontextmanager
async def pair(*, b_down: bool = False, standby: bool = False,
               b_app: web.Application | None = None,
               owners: dict[int, str] | None = None,
               b_owners: dict[int, str] | None = None) -> AsyncIterator[Pair]:
    """A and B served; A routes with a map naming B the owner of USER_B's partition and A of
    USER_A's. ``b_down``: B's server is closed before A is asked. ``standby``: A keeps a
    standby shard of USER_B's partition. ``b_app``: what B serves instead of a worker.
    ``b_owners``: B's own map (default: the same as A's)."""
    a, b = WorkerBackend("A"), WorkerBackend("B")
    seen: list[dict[str, str]] = []
    b_router: Router | None = None
    if b_app is None:
        cluster_b = Cluster(Worker("B", "http://b.invalid"))
        b_router = Router(cluster_b, PARTITIONS, secret=SECRET)
        b_app = build_http_app(b, FakeAuthoriser(KEYS), router=b_router)  # type: ignore[arg-type]
        with_cluster_route(b_app, "B")

    async def note(request: web.Request, _: web.StreamResponse) -> None:
        seen.append(dict(request.headers))

    b_app.on_response_prepare.append(note)
    b_server = TestServer(b_app)
    await b_server.start_server()
    url_b = url_of(b_server)
    store = PartitionedStore(lambda t, u: partition_of(t, u, PARTITIONS))
    if standby:
        store.standby[PB] = object()  # type: ignore[assignment]
    cluster = Cluster(Worker("A", "http://a.invalid"))
    router = Router(cluster, PARTITIONS, store, secret=SECRET)
    app_a = build_http_app(a, FakeAuthoriser(KEYS), router=router)  # type: ignore[arg-type]
    with_cluster_route(app_a, "A")
    try:
        async with TestClient(TestServer(app_a)) as client:
            url_a = url_of(client.server)
            cluster.update("apply", the_map(url_a, url_b, owners))
            if b_router is not None:
                b_router.cluster.update("apply", the_map(url_a, url_b,
                                                         owners if b_owners is None else b_owners))
            if b_down:
                await b_server.close()
            yield Pair(client, a, b, router, cluster, b_server, seen)
    finally:
        await router.close()
        if b_router is not None:
            await b_router.close()
        await b_server.close()


def signed(method: str, target: str, body: bytes, principal: Principal, *, worker: str,
           standby: bool = False, secret: str = SECRET, now: float | None = None,
           idempotency_key: str | None = None, to: str = "A") -> dict[str, str]:
    """The headers of a request ``worker`` forwards to ``to`` (as web.forwarding.outbound
    makes them)."""
    headers = {FORWARDED: worker, TO: to, PRINCIPAL_HEADER: principal.model_dump_json()}
    if body:
        headers["Content-Type"] = "application/json"
    if standby:
        headers[STANDBY_READ] = "1"
    if idempotency_key:
        headers[IDEMPOTENCY_KEY] = idempotency_key
    headers[CREDENTIAL_HEADER] = forward_credential(
        secret, worker=worker, method=method, target=target, body=body, headers=headers,
        now=time.time() if now is None else now)
    return headers


def counters(router: Router) -> tuple[int, int, int]:
    return router.forwarded, router.standby_served, router.failed


# --- 1. forwarded to the owner ----------------------------------------------------------------
@pytest.mark.parametrize(("method", "route", "body", "call"), SCOPED, ids=SCOPED_IDS)
async def test_a_request_for_the_owners_user_is_answered_by_the_owner(method, route, body,
                                                                      call):
    async with pair() as p:
        resp = await p.client.request(method, at(route), json=body, headers=bearer())
        got = await resp.json()
        assert resp.status == 200, got
        assert resp.headers[SERVED_BY] == "B"
        assert STANDBY not in resp.headers
        assert p.b.called() == [(call, TENANT, USER_B)]
        assert p.a.calls == [] and p.a.ready_calls == 0
        assert p.b.standby_flags == [False]
        assert counters(p.router) == (1, 0, 0)
        assert p.b_seen[0][FORWARDED] == "A"
        # the same answer B gives when asked itself
        direct = await p.client.session.request(
            method, p.b_server.make_url(at(route)), json=body, headers=bearer())
        assert direct.status == resp.status
        assert await direct.json() == got
    assert "B" in str(got)  # the body B's backend made (it names B)


async def test_the_owner_gets_no_key_of_the_callers_only_a_credential():
    headers = {"Authorization": f"Bearer {TENANT_KEY}", "X-API-Key": "another-key",
               "Accept": "application/json"}
    async with pair() as p:
        resp = await p.client.post(at(paths.SEARCH), json={"query": "tea"}, headers=headers)
        assert resp.status == 200, await resp.text()
        [seen] = p.b_seen
    assert "Authorization" not in seen and "X-API-Key" not in seen
    assert TENANT_KEY not in str(seen)
    assert seen["Accept"] == "application/json"
    assert seen["Content-Type"] == "application/json"
    assert seen[FORWARDED] == "A"
    assert seen[CREDENTIAL_HEADER].startswith("v1 ")
    assert Principal.model_validate_json(seen[PRINCIPAL_HEADER]) == KEYS[TENANT_KEY]


@pytest.mark.parametrize(("method", "route", "body", "call"), SCOPED, ids=SCOPED_IDS)
async def test_a_key_presented_only_as_x_api_key_works_through_the_forward(method, route, body,
                                                                           call):
    async with pair() as p:
        resp = await p.client.request(method, at(route), json=body,
                                      headers={"X-API-Key": TENANT_KEY})
        assert resp.status == 200, await resp.text()
        assert resp.headers[SERVED_BY] == "B"
        assert p.b.called() == [(call, TENANT, USER_B)]
        assert p.a.calls == []
        assert "Authorization" not in p.b_seen[0] and "X-API-Key" not in p.b_seen[0]


async def test_an_unknown_key_is_refused_where_it_arrives():
    async with pair() as p:
        resp = await p.client.post(at(paths.SEARCH), json={"query": "tea"},
                                   headers={"X-API-Key": "not-a-key"})
        await error_of(resp, 401, ErrorCode.UNAUTHORIZED)
        assert resp.headers["WWW-Authenticate"] == "Bearer"
        assert SERVED_BY not in resp.headers
        assert p.a.calls == [] and p.b.calls == [] and p.b_seen == []
        assert counters(p.router) == (0, 0, 0)


async def test_the_query_string_passes_unchanged():
    query = {"limit": "7", "cursor": "a+b c/d%e&f=g?h", "status": "all", "type": "semantic"}
    async with pair() as p:
        resp = await p.client.get(at(paths.MEMORIES), params=query, headers=bearer())
        assert resp.status == 200, await resp.text()
        assert p.b.calls == [("list_memories", TENANT, USER_B,
                              {"limit": 7, "cursor": "a+b c/d%e&f=g?h", "status": "all",
                               "type": "semantic"})]
        assert p.a.calls == []


async def test_a_json_body_passes_unchanged():
    body = {"query": "grüner Tee, \"bitte\" \\ 🍵", "k": 4, "statuses": ["active", "archived"],
            "include_global": False}
    async with pair() as p:
        resp = await p.client.post(at(paths.SEARCH), json=body, headers=bearer())
        assert resp.status == 200, await resp.text()
        [call] = p.b.calls
    assert call[:3] == ("search", TENANT, USER_B)
    assert call[3] == SearchRequest.model_validate(body)


async def test_a_body_the_owner_refuses_is_refused_by_the_owner():
    async with pair() as p:
        resp = await p.client.post(at(paths.SEARCH), json={"query": "tea", "colour": "red"},
                                   headers=bearer())
        assert "colour" in await error_of(resp, 400, ErrorCode.BAD_REQUEST)
        assert resp.headers[SERVED_BY] == "B"
        assert p.a.calls == [] and p.b.calls == [] and len(p.b_seen) == 1


async def test_an_oversized_body_without_a_key_gets_the_owners_401():
    """Refused where it arrives, as the owner would refuse it (key first, then size),
    without reading it all or sending it on."""
    async with pair() as p:
        resp = await p.client.post(at(paths.SEARCH), data=b"x" * 70_000)
        direct = await p.client.session.post(p.b_server.make_url(at(paths.SEARCH)),
                                             data=b"x" * 70_000)
        assert direct.status == 401
        assert resp.status == direct.status, await resp.text()
        assert len(p.b_seen) == 1  # only the direct request reached B


@pytest.mark.parametrize("user", ["u:1@x+y=z", "a.b_c-d", "x=y+z@w"])
async def test_ids_with_every_allowed_character_reach_the_owner_as_they_are(user):
    owners = {n: "B" for n in range(PARTITIONS)}
    async with pair(owners=owners) as p:
        resp = await p.client.get(at(paths.MEMORIES, user=user), headers=bearer())
        assert resp.status == 200, await resp.text()
        assert p.b.called() == [("list_memories", TENANT, user)]
        assert p.a.calls == []


# --- 2. served here -------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "route", "body", "call"), SCOPED, ids=SCOPED_IDS)
async def test_a_request_for_this_workers_own_user_is_served_here(method, route, body, call):
    async with pair() as p:
        resp = await p.client.request(method, at(route, user=USER_A), json=body,
                                      headers=bearer())
        assert resp.status == 200, await resp.text()
        assert resp.headers[SERVED_BY] == "A"
        assert STANDBY not in resp.headers
        assert p.a.called() == [(call, TENANT, USER_A)]
        assert p.a.standby_flags == [False]
        assert p.b.calls == [] and p.b_seen == []
        assert counters(p.router) == (0, 0, 0)


async def test_a_partition_the_map_gives_nobody_is_served_here():
    async with pair() as p:
        resp = await p.client.get(at(paths.MEMORIES, user=USER_FREE), headers=bearer())
        assert resp.status == 200, await resp.text()
        assert resp.headers[SERVED_BY] == "A"
        assert p.a.called() == [("list_memories", TENANT, USER_FREE)]
        assert p.b_seen == [] and counters(p.router) == (0, 0, 0)


async def test_without_a_map_everything_is_served_here():
    async with pair() as p:
        p.cluster.maps.clear()
        resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
        assert resp.status == 200, await resp.text()
        assert resp.headers[SERVED_BY] == "A"
        assert p.a.called() == [("list_memories", TENANT, USER_B)]
        assert p.b_seen == []


async def test_the_apply_map_is_preferred_to_the_ingest_map():
    async with pair() as p:
        url_a, url_b = url_of(p.client.server), url_of(p.b_server)
        p.cluster.update("ingest", the_map(url_a, url_b, {PB: "A"}))
        resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
        assert resp.status == 200 and resp.headers[SERVED_BY] == "B"
        assert p.a.calls == []


# --- 3. no loops ----------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "route", "body", "call"), SCOPED, ids=SCOPED_IDS)
async def test_a_forwarded_request_is_served_here_whatever_the_map_says(method, route, body,
                                                                        call):
    async with pair() as p:
        target = at(route)
        raw = json.dumps(body).encode() if body is not None else b""
        headers = signed(method, target, raw, KEYS[TENANT_KEY], worker="C")
        resp = await p.client.request(method, target, data=raw or None, headers=headers)
        assert resp.status == 200, await resp.text()
        assert p.a.called() == [(call, TENANT, USER_B)]
        assert p.a.standby_flags == [False]
        assert p.b.calls == [] and p.b_seen == []
        assert counters(p.router) == (0, 0, 0)


async def test_two_workers_whose_maps_disagree_do_not_loop():
    # A says B owns the user, B says A does: A forwards once, B answers.
    async with pair(b_owners={PB: "A"}) as p:
        resp = await asyncio.wait_for(
            p.client.get(at(paths.MEMORIES), headers=bearer()), timeout=5)
        assert resp.status == 200, await resp.text()
        assert resp.headers[SERVED_BY] == "B"
        assert p.b.called() == [("list_memories", TENANT, USER_B)]
        assert p.a.calls == []
        assert len(p.b_seen) == 1 and counters(p.router) == (1, 0, 0)


# --- 4. the owner is down -------------------------------------------------------------------
@pytest.mark.parametrize(("method", "route", "body", "call"), STANDBY_READS)
async def test_an_unreachable_owner_reads_are_served_from_the_standby(method, route, body,
                                                                      call):
    async with pair(b_down=True, standby=True) as p:
        resp = await p.client.request(method, at(route), json=body, headers=bearer())
        assert resp.status == 200, await resp.text()
        assert resp.headers[STANDBY] == "1"
        assert resp.headers[SERVED_BY] == "A"
        assert "A" in str(await resp.json())
        assert p.a.called() == [(call, TENANT, USER_B)]
        assert p.a.standby_flags == [True]  # inside standby_reads()
        assert p.b.calls == []
        assert counters(p.router) == (0, 1, 1)
        # standby reads end with the request: A's own user next is read normally
        resp = await p.client.request(method, at(route, user=USER_A), json=body,
                                      headers=bearer())
        assert resp.status == 200 and STANDBY not in resp.headers
        assert p.a.standby_flags == [True, False]


@pytest.mark.parametrize(("method", "route", "body", "call"), READS, ids=READ_IDS)
async def test_an_unreachable_owner_without_a_standby_is_503(method, route, body, call):
    async with pair(b_down=True) as p:
        resp = await p.client.request(method, at(route), json=body, headers=bearer())
        await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        assert resp.headers["Retry-After"] == "1"
        assert STANDBY not in resp.headers
        assert p.a.calls == [] and p.a.ready_calls == 0 and p.b.calls == []
        assert counters(p.router) == (0, 0, 1)


@pytest.mark.parametrize(("method", "route", "body", "call"), WRITES, ids=WRITE_IDS)
async def test_writes_and_tool_calls_are_never_served_from_a_standby(method, route, body, call):
    async with pair(b_down=True, standby=True) as p:
        resp = await p.client.request(method, at(route), json=body, headers=bearer())
        await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        assert STANDBY not in resp.headers
        assert p.a.calls == [] and p.a.ready_calls == 0
        assert counters(p.router) == (0, 0, 1)


async def test_a_standby_of_another_partition_does_not_serve_this_user():
    async with pair(b_down=True) as p:
        p.router.store.standby[PF] = object()  # not USER_B's partition
        resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
        await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        assert p.a.calls == []


async def test_a_standby_read_still_checks_the_key():
    async with pair(b_down=True, standby=True) as p:
        resp = await p.client.get(at(paths.MEMORIES), headers={"X-API-Key": "not-a-key"})
        await error_of(resp, 401, ErrorCode.UNAUTHORIZED)
        assert p.a.calls == []


async def test_an_owner_that_does_not_answer_in_time_counts_as_down():
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", slow)
    async with pair(b_app=app, standby=True) as p:
        p.router.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2))
        resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
        assert resp.status == 200, await resp.text()
        assert resp.headers[STANDBY] == "1" and resp.headers[SERVED_BY] == "A"
        assert counters(p.router) == (0, 1, 1)


# --- 5. the owner answers 5xx / 404 ---------------------------------------------------------
@pytest.mark.parametrize("status", [502, 503, 504])
async def test_an_owner_answering_502_503_504_is_treated_as_down(status):
    async with pair(b_app=raw_app(status), standby=True) as p:
        resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
        assert resp.status == 200, await resp.text()
        assert resp.headers[STANDBY] == "1" and resp.headers[SERVED_BY] == "A"
        assert p.a.standby_flags == [True]
        resp = await p.client.post(at(paths.EXECUTE_TOOL), json=SCOPED[4][2], headers=bearer())
        await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        assert len(p.b_seen) == 2 and len(p.a.calls) == 1
        assert counters(p.router) == (0, 1, 2)


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_an_owner_answering_502_503_504_without_a_standby_is_503(status):
    async with pair(b_app=raw_app(status)) as p:
        resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
        await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        assert p.a.calls == [] and counters(p.router) == (0, 0, 1)


async def test_an_owner_that_is_still_starting_is_treated_as_down():
    async with pair(standby=True) as p:
        p.b.is_ready = False  # B answers 503 "starting"
        resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
        assert resp.status == 200, await resp.text()
        assert resp.headers[STANDBY] == "1" and resp.headers[SERVED_BY] == "A"
        assert p.b.ready_calls == 1 and p.b.calls == []
        assert p.a.called() == [("list_memories", TENANT, USER_B)]
        assert counters(p.router) == (0, 1, 1)


async def test_an_owners_404_is_passed_through():
    async with pair(standby=True) as p:
        p.b.fail = ApiError(404, ErrorCode.NOT_FOUND, "no such memory")
        resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
        assert await error_of(resp, 404, ErrorCode.NOT_FOUND) == "no such memory"
        assert resp.headers["Content-Type"].startswith("application/json")
        assert resp.headers[SERVED_BY] == "B"
        assert STANDBY not in resp.headers
        assert p.b.called() == [("list_memories", TENANT, USER_B)]
        assert p.a.calls == []
        assert counters(p.router) == (1, 0, 0)


# --- 6. not scoped to a user: never forwarded -----------------------------------------------
@pytest.mark.parametrize(("route", "headers", "answer"), [
    (paths.HEALTH, {},
     {"status": "ok", "owned": [], "restoring": [], "forwarding": False, "waiting": []}),
    (paths.TOOLS, {"X-API-Key": TENANT_KEY},
     {"tools": [{"type": "function", "function": {"name": "tool-of-A"}}]}),
    (paths.CLUSTER, bearer(ADMIN_KEY), {"worker": "A"}),
], ids=["health", "tools", "cluster"])
@pytest.mark.parametrize("b_down", [False, True], ids=["owner-up", "owner-down"])
async def test_requests_not_scoped_to_a_user_are_never_forwarded(route, headers, answer,
                                                                 b_down):
    # every partition is B's: were anything forwarded, B would answer it
    owners = {n: "B" for n in range(PARTITIONS)}
    async with pair(owners=owners, b_down=b_down) as p:
        resp = await p.client.get(route, headers=headers)
        assert resp.status == 200, await resp.text()
        assert await resp.json() == answer
        assert p.b_seen == [] and p.b.calls == [] and p.b.ready_calls == 0
        assert counters(p.router) == (0, 0, 0)


# --- 7. the counters --------------------------------------------------------------------------
async def test_the_counters_follow_what_happened():
    async with pair(standby=True) as p:
        ok = await p.client.get(at(paths.MEMORIES), headers=bearer())  # forwarded
        assert ok.status == 200 and counters(p.router) == (1, 0, 0)
        await p.client.get(at(paths.MEMORIES, user=USER_A), headers=bearer())  # here
        await p.client.get(at(paths.MEMORIES), headers=signed(  # B's forward: here
            "GET", at(paths.MEMORIES), b"", KEYS[TENANT_KEY], worker="B"))
        await p.client.get(paths.HEALTH)
        assert counters(p.router) == (1, 0, 0)
        p.b.fail = ApiError(404, ErrorCode.NOT_FOUND, "gone")
        await p.client.get(at(paths.MEMORIES), headers=bearer())  # forwarded, 404
        assert counters(p.router) == (2, 0, 0)
        assert p.b_server is not None
        await p.b_server.close()  # B goes down
        resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
        assert resp.status == 200 and resp.headers[STANDBY] == "1"
        assert counters(p.router) == (2, 1, 1)
        resp = await p.client.post(at(paths.FEEDBACK), json=SCOPED[3][2], headers=bearer())
        assert resp.status == 503
        assert counters(p.router) == (2, 1, 2)
        p.router.store.standby.clear()
        resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
        assert resp.status == 503
        assert counters(p.router) == (2, 1, 3)


async def test_a_worker_without_a_standby_asks_the_standby_worker_when_the_owner_is_down():
    """A has no standby of B's partition; C has: A's read of B's user (B down) is answered
    by C from its standby, marked; a write is still refused (503), and C never serves a
    standby read that was not forwarded as one."""
    c_backend = WorkerBackend("C")
    c_store = PartitionedStore(lambda t, u: partition_of(t, u, PARTITIONS))
    c_store.standby[PB] = object()  # type: ignore[assignment]
    cluster_c = Cluster(Worker("C", "http://c.invalid"))
    c_router = Router(cluster_c, PARTITIONS, c_store, secret=SECRET)
    c_app = build_http_app(c_backend, FakeAuthoriser(KEYS), router=c_router)  # type: ignore[arg-type]
    c_server = TestServer(c_app)
    await c_server.start_server()
    try:
        async with pair(b_down=True) as p:
            url_c = url_of(c_server)
            url_a = url_of(p.client.server)
            url_b = p.cluster.routing().workers["B"]  # closed: its port is refused
            three = ClusterMap(workers={"A": url_a, "B": url_b, "C": url_c},
                               owners={PB: "B", PA: "A"}, standbys={PB: ("C",)})
            p.cluster.update("apply", three)
            cluster_c.update("apply", three)
            resp = await p.client.get(at(paths.MEMORIES), headers=bearer())
            assert resp.status == 200, await resp.text()
            assert resp.headers[SERVED_BY] == "C" and resp.headers[STANDBY] == "1"
            assert c_backend.called() == [("list_memories", TENANT, USER_B)]
            assert c_backend.standby_flags == [True] and p.a.calls == []
            write = await p.client.post(at(paths.FEEDBACK), headers=bearer(),
                                        json={"query_id": "q", "memory_id": "m"})
            assert write.status == 503 and c_backend.called() == [
                ("list_memories", TENANT, USER_B)]
    finally:
        await c_router.close()
        await c_server.close()


# --- the HTTP way in: produced where it arrives ---------------------------------------------
async def test_the_http_way_in_is_served_where_it_arrives_even_with_its_owner_down():
    """Any worker produces a user's messages (the partitioner places them): no forward, so
    an owner that does not answer costs a write nothing."""
    body = {"session_id": "s1", "messages": [{"role": "user", "content": "hi"}]}
    end = paths.fill(paths.SESSION_END, tenant=TENANT, user=USER_B, session_id="s1")
    async with pair(b_down=True) as p:
        resp = await p.client.post(at(paths.MESSAGES), json=body, headers=bearer())
        assert resp.status == 202, await resp.text()
        assert (await p.client.post(end, headers=bearer())).status == 202
        assert p.a.called() == [("add_messages", TENANT, USER_B),
                                ("end_session", TENANT, USER_B)]
        assert counters(p.router) == (0, 0, 0)
        foreign = await p.client.post(at(paths.MESSAGES, tenant="globex"), json=body,
                                      headers=bearer())
        await error_of(foreign, 403, ErrorCode.FORBIDDEN)  # still checked here
