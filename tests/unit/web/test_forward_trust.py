"""The HTTP API trusts nothing it did not verify (issue 29): keys are checked where a request
arrives, before anything is forwarded; clients cannot send the workers' own headers; a
forward carries a signed worker credential instead of the caller's key; only JSON answers
are relayed; bodies arrive whole; writes are taken once per Idempotency-Key; the metrics
key does not open the cluster map; failed key checks are limited; workers speak TLS.

Worker A (the one asked) is the real app over a fake backend; the owner B of every
partition is the real app too, or a bare app recording what reaches it."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest

from memstream.client import MemoryClient
from memstream.contract.http_api import paths
from memstream.contract.http_api.api import ErrorCode, Principal, ToolCallRequest, ToolResult
from memstream.contract.http_api.history import CorrectionRequest
from memstream.core.cluster_auth import CREDENTIAL_HEADER, IDEMPOTENCY_KEY, forward_credential
from memstream.dev.tls import write_dev_tls
from memstream.memory.store.partitioned import PartitionedStore, partition_of
from memstream.streams.cluster import Cluster, ClusterMap, Worker
from memstream.streams.counters import Counters
from memstream.topics.schemas import ToolWrite
from memstream.web import backend as worker_backend
from memstream.web import backend_history as history
from memstream.web.forwarding import PRINCIPAL_HEADER, TO, server_ssl
from memstream.web.http import HttpServer, build_http_app
from memstream.web.http_base import DEPS, LoginGuard, key_prefix
from memstream.web.prometheus import METRICS, MetricsDeps, PipelineCollector, registry_for
from memstream.web.routing import (
    FORWARD_TIMEOUT_S,
    FORWARDED,
    SERVED_BY,
    STANDBY,
    STANDBY_READ,
    Router,
)
from tests.unit.builders import (
    ADMIN_KEY,
    KEYS,
    TENANT_KEY,
    FakeAuthoriser,
    FakeBackend,
    bearer,
    error_of,
)

pytestmark = pytest.mark.unit

PARTITIONS = 4
SECRET = "cluster-secret-0123456789abcdef-0123"
TENANT, USER = "acme", "u1"
OTHER_TENANT_KEY = "key-globex-0123456789"
ALL_KEYS = {**KEYS, OTHER_TENANT_KEY: Principal(key_id="k-globex", tenant_id="globex")}
TOOL_WRITE = {"name": "memory_insert", "arguments": {"content": "likes tea"}, "wait_s": 0}


def at(route: str, user: str = USER) -> str:
    return paths.fill(route, tenant=TENANT, user=user)


@dataclass
class Seen:
    """What reached a bare owner app: (method, path with query, headers, body)."""

    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)


def bare_owner(seen: Seen, answer: Callable[[], web.Response] | None = None) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.requests.append((request.method, request.raw_path, dict(request.headers), body))
        if answer is not None:
            return answer()
        return web.json_response({"bytes": len(body)})

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


class OnceBackend(FakeBackend):
    """Applies a tool write once per idempotency key, as the ingest stage takes a request
    id once (memory.coalescing.on_tool); ``delay_s``: how long the first one takes."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.applied: list[str | None] = []

    async def execute_tool(self, tenant: str, user: str, req: ToolCallRequest,
                           principal: Principal,
                           idempotency_key: str | None = None) -> ToolResult:
        await super().execute_tool(tenant, user, req, principal, idempotency_key)
        if idempotency_key is None or idempotency_key not in self.applied:
            self.applied.append(idempotency_key)
            await asyncio.sleep(self.delay_s)
        return ToolResult(tool_call_id=req.tool_call_id, name=req.name, status="ok",
                          content="done")


def router(name: str, *, secret: str | None = SECRET, store: Any = None,
           ca: Path | None = None) -> Router:
    return Router(Cluster(Worker(name, f"http://{name}.invalid")), PARTITIONS, store,
                  secret=secret, ca=ca)


def real_worker(backend: FakeBackend, name: str, **kw: Any) -> tuple[web.Application, Router]:
    r = router(name, **{k: v for k, v in kw.items() if k in ("secret", "store", "ca")})
    app = build_http_app(backend, FakeAuthoriser(ALL_KEYS), router=r,  # type: ignore[arg-type]
                         **{k: v for k, v in kw.items() if k in ("max_body_bytes",)})
    return app, r


@dataclass
class Two:
    client: TestClient  # talks to A
    a: FakeBackend
    a_router: Router
    owner_url: str


@asynccontextmanager
async def two(owner: web.Application, *, standby: bool = False, max_body: int = 65536,
              owner_server: Any = None, ca: Path | None = None) -> AsyncIterator[Two]:
    """A routes every partition to ``owner`` (served plain, or by ``owner_server``)."""
    server = owner_server or TestServer(owner)
    if owner_server is None:
        await server.start_server()
        url = f"http://{server.host}:{server.port}"
    else:
        await server.start()
        url = f"https://127.0.0.1:{server.port}"
    store = PartitionedStore(lambda t, u: partition_of(t, u, PARTITIONS))
    if standby:
        store.standby[partition_of(TENANT, USER, PARTITIONS)] = object()  # type: ignore[assignment]
    a = FakeBackend()
    app_a, r = real_worker(a, "A", store=store, max_body_bytes=max_body, ca=ca)
    try:
        async with TestClient(TestServer(app_a)) as client:
            the_map = ClusterMap(workers={"A": "http://a.invalid", "B": url},
                                 owners={n: "B" for n in range(PARTITIONS)})
            r.cluster.update("apply", the_map)
            yield Two(client, a, r, url)
    finally:
        await r.close()
        await (server.stop() if owner_server is not None else server.close())


@asynccontextmanager
async def owner_b(backend: FakeBackend | None = None,
                  ) -> AsyncIterator[tuple[TestClient, FakeBackend, Router]]:
    """B alone (a client talks to it directly), its map naming it the owner of all."""
    b = backend or FakeBackend()
    app, r = real_worker(b, "B")
    r.cluster.update("apply", ClusterMap(workers={"B": "http://b.invalid"},
                                         owners={n: "B" for n in range(PARTITIONS)}))
    try:
        async with TestClient(TestServer(app)) as client:
            yield client, b, r
    finally:
        await r.close()


def signed(method: str, target: str, body: bytes = b"", *, worker: str = "A",
           principal: Principal = KEYS[TENANT_KEY], secret: str = SECRET,
           now: float | None = None, extra: dict[str, str] | None = None,
           to: str = "B") -> dict[str, str]:
    headers = {FORWARDED: worker, TO: to, PRINCIPAL_HEADER: principal.model_dump_json(),
               **(extra or {})}
    if body:
        headers["Content-Type"] = "application/json"
    headers[CREDENTIAL_HEADER] = forward_credential(
        secret, worker=worker, method=method, target=target, body=body, headers=headers,
        now=time.time() if now is None else now)
    return headers


# --- 1. the key and the tenant are checked where the request arrives ---------------------
@pytest.mark.parametrize(("headers", "status", "code"), [
    ({}, 401, ErrorCode.UNAUTHORIZED),
    ({"X-API-Key": "not-a-key"}, 401, ErrorCode.UNAUTHORIZED),
    (bearer(OTHER_TENANT_KEY), 403, ErrorCode.FORBIDDEN),
], ids=["no-key", "unknown-key", "other-tenant"])
@pytest.mark.parametrize(("method", "route", "body"), [
    ("GET", paths.MEMORIES, None), ("POST", paths.SEARCH, {"query": "tea"}),
    ("POST", paths.EXECUTE_TOOL, TOOL_WRITE)], ids=["list", "search", "tool"])
async def test_a_caller_without_a_key_for_the_tenant_is_refused_before_any_forward(
        headers, status, code, method, route, body):
    seen = Seen()
    async with two(bare_owner(seen), standby=True) as t:
        resp = await t.client.request(method, at(route), json=body, headers=headers)
        await error_of(resp, status, code)
        assert SERVED_BY not in resp.headers
        assert seen.requests == [] and t.a.calls == []
        assert (t.a_router.forwarded, t.a_router.failed) == (0, 0)


# --- 2. the workers' headers are not the clients' -----------------------------------------
async def test_a_client_cannot_ask_for_a_standby_read_or_claim_to_be_forwarded():
    async with owner_b() as (_, b, b_router), two(b_router_app(b, b_router), standby=True) as t:
        resp = await t.client.get(at(paths.MEMORIES), headers={
            **bearer(), FORWARDED: "B", STANDBY_READ: "1", "X-Memstream-Whatever": "x"})
        assert resp.status == 200, await resp.text()
        assert resp.headers[SERVED_BY] == "B" and STANDBY not in resp.headers
        assert t.a.calls == [] and [c[0] for c in b.calls] == ["list_memories"]
        admin = Principal(key_id="k-admin", admin=True).model_dump_json()
        resp = await t.client.get(at(paths.MEMORIES), headers={  # no key, a principal
            FORWARDED: "B", PRINCIPAL_HEADER: admin})
        await error_of(resp, 401, ErrorCode.UNAUTHORIZED)
        assert len(b.calls) == 1 and t.a.calls == []


def b_router_app(b: FakeBackend, r: Router) -> web.Application:
    """Another app of B's backend and router (owner_b's is served by its own client)."""
    return build_http_app(b, FakeAuthoriser(ALL_KEYS), router=r)  # type: ignore[arg-type]


async def test_the_owner_gets_the_principal_and_a_credential_never_the_key():
    seen = Seen()
    async with two(bare_owner(seen)) as t:
        resp = await t.client.post(at(paths.SEARCH), json={"query": "tea"},
                                   headers={**bearer(), "X-API-Key": TENANT_KEY})
        assert resp.status == 200, await resp.text()
    [(method, target, headers, body)] = seen.requests
    assert TENANT_KEY not in json.dumps(headers)
    assert "Authorization" not in headers and "X-API-Key" not in headers
    assert headers[FORWARDED] == "A" and headers[CREDENTIAL_HEADER].startswith("v1 ")
    assert Principal.model_validate_json(headers[PRINCIPAL_HEADER]) == KEYS[TENANT_KEY]
    assert (method, target, json.loads(body)) == ("POST", at(paths.SEARCH), {"query": "tea"})


async def test_a_forward_with_a_valid_credential_is_served_for_its_principal():
    async with owner_b() as (client, b, _):
        target = at(paths.MEMORIES)
        resp = await client.get(target, headers=signed("GET", target))
        assert resp.status == 200, await resp.text()
        assert [c[:3] for c in b.calls] == [("list_memories", TENANT, USER)]


def _forged(target: str) -> dict[str, str]:
    return signed("GET", target, secret="another-secret-0123456789abcdef-012")


def _expired(target: str) -> dict[str, str]:
    return signed("GET", target, now=time.time() - 120)


def _other_path(target: str) -> dict[str, str]:
    return signed("GET", at(paths.MEMORIES, user="someone-else"))


def _for_another_worker(target: str) -> dict[str, str]:  # a capture played at B, made for C
    return signed("GET", target, to="C")


def _raised_principal(target: str) -> dict[str, str]:
    headers = signed("GET", target)
    headers[PRINCIPAL_HEADER] = Principal(key_id="k", admin=True).model_dump_json()
    return headers


@pytest.mark.parametrize("make", [_forged, _expired, _other_path, _raised_principal,
                                  _for_another_worker],
                         ids=["forged", "expired", "other-path", "edited-principal",
                              "for-another-worker"])
async def test_the_owner_refuses_a_credential_that_does_not_verify(make):
    async with owner_b() as (client, b, _):
        target = at(paths.MEMORIES)
        good = await client.get(target, headers=signed("GET", target))  # the control
        assert good.status == 200, await good.text()
        resp = await client.get(target, headers=make(target))
        await error_of(resp, 401, ErrorCode.UNAUTHORIZED)
        assert len(b.calls) == 1


async def test_the_owner_refuses_a_replayed_credential():
    async with owner_b() as (client, b, _):
        target = at(paths.MEMORIES)
        headers = signed("GET", target)
        first = await client.get(target, headers=headers)
        assert first.status == 200, await first.text()
        again = await client.get(target, headers=headers)
        await error_of(again, 401, ErrorCode.UNAUTHORIZED)
        assert len(b.calls) == 1


async def test_a_worker_without_the_secret_accepts_no_forward_and_forwards_nothing():
    b = FakeBackend()
    app, r = real_worker(b, "B", secret=None)
    r.cluster.update("apply", ClusterMap(workers={"B": "http://b.invalid", "C": "http://c"},
                                         owners={n: "C" for n in range(PARTITIONS)}))
    async with TestClient(TestServer(app)) as client:
        target = at(paths.MEMORIES)
        await error_of(await client.get(target, headers=signed("GET", target)), 401,
                       ErrorCode.UNAUTHORIZED)
        resp = await client.get(target, headers=bearer())  # C "owns" it: served here
        assert resp.status == 200 and resp.headers[SERVED_BY] == "B"
        assert r.forwarded == r.failed == 0
    await r.close()


# --- 3. only JSON answers are relayed -------------------------------------------------------
def _html() -> web.Response:
    return web.Response(text="<script>alert(1)</script>", content_type="text/html")


@pytest.mark.parametrize("standby", [True, False], ids=["standby", "no-standby"])
async def test_an_owner_answer_that_is_not_json_is_not_relayed(standby):
    seen = Seen()
    async with two(bare_owner(seen, _html), standby=standby) as t:
        resp = await t.client.get(at(paths.MEMORIES), headers=bearer())
        text = await resp.text()
        assert "<script>" not in text
        assert resp.headers["Content-Type"].startswith("application/json")
        if standby:
            assert resp.status == 200 and resp.headers[STANDBY] == "1"
        else:
            await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        assert len(seen.requests) == 1 and t.a_router.failed == 1


# --- 4. bodies arrive whole, or are refused -------------------------------------------------
async def _chunks(total: int, size: int = 16 * 1024) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        yield b"x" * n
        sent += n
        await asyncio.sleep(0.001)  # the body arrives in pieces, as over a network


async def test_a_large_chunked_body_reaches_the_owner_whole():
    seen = Seen()
    total = 900 * 1024
    async with two(bare_owner(seen), max_body=1024 * 1024) as t:
        resp = await t.client.post(at(paths.SEARCH), data=_chunks(total), headers=bearer())
        assert resp.status == 200, await resp.text()
        assert await resp.json() == {"bytes": total}
    [(_, _, _, body)] = seen.requests
    assert len(body) == total


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
async def test_a_body_over_the_limit_is_413_and_not_forwarded(chunked):
    seen = Seen()
    total = 1024 * 1024 + 1
    async with two(bare_owner(seen), max_body=1024 * 1024) as t:
        data: Any = _chunks(total) if chunked else b"x" * total
        resp = await t.client.post(at(paths.SEARCH), data=data, headers=bearer())
        await error_of(resp, 413, ErrorCode.PAYLOAD_TOO_LARGE)
        assert seen.requests == []


# --- 5. writes are taken once per Idempotency-Key -------------------------------------------
def test_the_forward_outlasts_the_longest_wait_a_write_may_ask_for():
    for model in (ToolCallRequest, CorrectionRequest):
        longest = max(m.le for m in model.model_fields["wait_s"].metadata if hasattr(m, "le"))
        assert longest + 5 <= FORWARD_TIMEOUT_S


async def test_a_write_retried_with_its_key_after_the_forward_timed_out_is_applied_once():
    b = OnceBackend(delay_s=0.5)
    async with owner_b(b) as (_, _, b_router), two(b_router_app(b, b_router)) as t:
        t.a_router.timeout = aiohttp.ClientTimeout(total=0.2)
        headers = {**bearer(), IDEMPOTENCY_KEY: "retry-me-1"}
        first = await t.client.post(at(paths.EXECUTE_TOOL), json=TOOL_WRITE, headers=headers)
        await error_of(first, 503, ErrorCode.UNAVAILABLE)
        assert first.headers[IDEMPOTENCY_KEY] == "retry-me-1"
        await asyncio.sleep(0.5)  # the owner applied it meanwhile
        again = await t.client.post(at(paths.EXECUTE_TOOL), json=TOOL_WRITE, headers=headers)
        assert again.status == 200, await again.text()
        assert again.headers[IDEMPOTENCY_KEY] == "retry-me-1"
    assert b.idempotency_keys == ["retry-me-1", "retry-me-1"]
    assert b.applied == ["retry-me-1"]


async def test_a_write_without_a_key_gets_one_made_where_it_arrived():
    b = OnceBackend()
    async with owner_b(b) as (_, _, b_router), two(b_router_app(b, b_router)) as t:
        resp = await t.client.post(at(paths.EXECUTE_TOOL), json=TOOL_WRITE, headers=bearer())
        assert resp.status == 200, await resp.text()
        made = resp.headers[IDEMPOTENCY_KEY]
    assert b.idempotency_keys == [made] and len(made) >= 16


@pytest.mark.parametrize("key", ["", "x" * 129, "has space", "-leading"])
async def test_a_bad_idempotency_key_is_400(key):
    async with owner_b() as (client, b, _):
        resp = await client.post(at(paths.EXECUTE_TOOL), json=TOOL_WRITE,
                                 headers={**bearer(), IDEMPOTENCY_KEY: key})
        await error_of(resp, 400, ErrorCode.BAD_REQUEST)
        assert b.calls == []


def test_a_writes_request_id_follows_its_idempotency_key():
    write = ToolWrite(name="memory_insert", content="likes tea")
    one = worker_backend._request_id(None, write, "k-1")
    assert one == worker_backend._request_id(None, write, "k-1")
    assert one != worker_backend._request_id(None, write, "k-2")
    assert worker_backend._request_id("call-1", write, "k-1") == \
        worker_backend._request_id("call-1", write, "k-2")  # the tool call id first
    delete = ToolWrite(name="delete", target_id="m1")
    assert history._request_id("t", "u", delete, 1.0, "k-1") == \
        history._request_id("t", "u", delete, 99.0, "k-1")
    assert history._request_id("t", "u", delete, 1.0) != history._request_id("t", "u", delete,
                                                                              2.0)


# --- 6. the metrics key opens the metrics only ----------------------------------------------
METRICS_KEY = "metrics-key-0123456789"


async def _refresh() -> None:
    return None


@pytest.mark.parametrize(("route", "key", "status"), [
    (paths.METRICS, METRICS_KEY, 200), (paths.METRICS_SUMMARY, METRICS_KEY, 200),
    (paths.CLUSTER, METRICS_KEY, 401), (paths.CLUSTER, ADMIN_KEY, 200),
])
async def test_the_metrics_key_does_not_open_the_cluster_map(route, key, status):
    from memstream.web.prometheus import summary

    app = build_http_app(FakeBackend(), FakeAuthoriser(KEYS))  # type: ignore[arg-type]
    counters = Counters()
    app[METRICS] = MetricsDeps(CollectorRegistry(), METRICS_KEY,
                               lambda: summary(counters, time.time()), _refresh,
                               cluster=lambda: {"worker": "A"})
    async with TestClient(TestServer(app)) as client:
        resp = await client.get(route, headers=bearer(key))
        assert resp.status == status, await resp.text()


# --- 7. failed key checks are limited -------------------------------------------------------
async def test_too_many_failed_key_checks_are_429_but_a_valid_key_from_there_opens():
    """One address (a NAT: many callers) failing too often: its wrong keys are 429, its
    valid keys still open (issue 47: they were 429 too)."""
    now = [1000.0]
    app = build_http_app(FakeBackend(), FakeAuthoriser(KEYS),  # type: ignore[arg-type]
                         login_failures_per_minute=3, clock=lambda: now[0])
    guard = app[DEPS].guard
    registry = registry_for(PipelineCollector(Counters(), auth_failures=guard.counts))
    async with TestClient(TestServer(app)) as client:
        for i in range(3):
            resp = await client.get(at(paths.MEMORIES), headers=bearer(f"guess-{i}"))
            await error_of(resp, 401, ErrorCode.UNAUTHORIZED)
        for _ in range(25):  # the right key, from the same address, as often as it likes
            resp = await client.get(at(paths.MEMORIES), headers=bearer())
            assert resp.status == 200, await resp.text()
        resp = await client.get(at(paths.MEMORIES), headers=bearer("guess-3"))
        await error_of(resp, 429, ErrorCode.RATE_LIMITED)
        assert 1 <= int(resp.headers["Retry-After"]) <= 60
        now[0] += 61
        resp = await client.get(at(paths.MEMORIES), headers=bearer("guess-4"))
        await error_of(resp, 401, ErrorCode.UNAUTHORIZED)
    text = generate_latest(registry).decode()
    assert 'memstream_auth_failures_total{reason="unknown_key"} 4.0' in text
    assert 'memstream_auth_failures_total{reason="rate_limited"} 1.0' in text


def test_a_valid_key_is_never_locked_out_by_failures_of_its_key_id():
    """A key id is no secret (it names the actor in lineage and audit): failures of other
    callers under it answer their wrong keys 429, never the valid key."""
    from unittest import mock

    from aiohttp.test_utils import make_mocked_request

    from memstream.web.http_base import ApiError
    from memstream.web.http_checks import check_key

    valid = "msk_0123456789abcdef_" + "v" * 40
    owner = Principal(key_id="0123456789abcdef", tenant_id="acme")
    app = build_http_app(FakeBackend(), FakeAuthoriser({valid: owner}),  # type: ignore[arg-type]
                         login_failures_per_minute=3)

    def check(key: str, address: str) -> Principal:
        transport = mock.Mock()
        transport.get_extra_info.return_value = (address, 40000)
        request = make_mocked_request("GET", "/", app=app, transport=transport)
        return check_key(request, key, app[DEPS].authoriser.authorise)

    for n in range(5):  # other callers, other addresses, the victim's key id
        with pytest.raises(ApiError) as refused:
            check("msk_0123456789abcdef_" + f"guess{n}" * 5, f"10.0.0.{n}")
        assert refused.value.status == (401 if n < 3 else 429)
    assert check(valid, "10.0.0.99") == owner  # the key itself still opens


def test_the_limit_counts_per_key_prefix_and_per_address_in_bounded_memory():
    now = [0.0]
    guard = LoginGuard(2, lambda: now[0], most=3)
    guard.failed("key:a", "addr:1")
    guard.failed("key:a", "addr:2")
    assert guard.retry_after("key:a", "addr:3") == 60.0  # the prefix is spent
    assert guard.retry_after("key:b", "addr:3") is None
    assert guard.retry_after("key:b", "addr:1") is None  # one failure from addr 1
    for n in range(10):
        guard.failed(f"key:{n}")
    assert len(guard._failed) <= 3
    assert key_prefix("msk_0123456789abcdef_" + "s" * 40) == "msk_0123456789abcdef"
    assert key_prefix("some-long-secret-key") == "some-long-se"


# --- 8. TLS -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return write_dev_tls(tmp_path_factory.mktemp("tls"))


@pytest.mark.parametrize("trusted", [True, False], ids=["with-the-ca", "system-cas"])
async def test_a_forward_to_a_tls_owner_verifies_it_with_the_ca(tls, trusted):
    b = FakeBackend()
    app_b, b_router = real_worker(b, "B")
    b_router.cluster.update("apply", ClusterMap(workers={"B": "https://b.invalid"},
                                                owners={n: "B" for n in range(PARTITIONS)}))
    server = HttpServer(app_b, "127.0.0.1", 0, server_ssl(tls.cert, tls.key))
    async with two(app_b, owner_server=server, ca=tls.ca if trusted else None) as t:
        resp = await t.client.get(at(paths.MEMORIES), headers=bearer())
        if trusted:
            assert resp.status == 200, await resp.text()
            assert resp.headers[SERVED_BY] == "B" and len(b.calls) == 1
        else:
            await error_of(resp, 503, ErrorCode.UNAVAILABLE)
            assert b.calls == [] and t.a_router.failed == 1
    await b_router.close()


async def test_the_client_verifies_the_api_with_a_ca_file(tls):
    app = build_http_app(FakeBackend(), FakeAuthoriser(KEYS))  # type: ignore[arg-type]
    server = HttpServer(app, "127.0.0.1", 0, server_ssl(tls.cert, tls.key))
    await server.start()
    url = f"https://127.0.0.1:{server.port}"
    try:
        trusting = MemoryClient(url, TENANT_KEY, tenant_id=TENANT, verify=tls.ca)
        doubting = MemoryClient(url, TENANT_KEY, tenant_id=TENANT)
        try:
            found = await asyncio.to_thread(trusting.search, "tea", user_id=USER)
            assert found.query_id == "q1"
            with pytest.raises(Exception, match=r"(?i)certificate"):
                await asyncio.to_thread(doubting.search, "tea", user_id=USER)
        finally:
            trusting.close()
            doubting.close()
    finally:
        await server.stop()


def test_the_dev_certificate_names_localhost_and_127_0_0_1(tls):
    context = ssl.create_default_context(cafile=str(tls.ca))
    context.load_cert_chain(str(tls.cert), str(tls.key))  # the pair matches
    text = Path(tls.cert).read_bytes()
    assert text.startswith(b"-----BEGIN CERTIFICATE-----")


def test_every_route_that_changes_something_takes_an_idempotency_key():
    from memstream.web.http import ROUTES, WRITES
    from memstream.web.openapi import openapi_document
    from memstream.web.routing import READS

    changing = {r.name for r in ROUTES if r.method != "GET" and r.path not in READS}
    assert WRITES == changing == {
        "feedback", "execute_tool", "delete_memory", "delete_memories", "rollback_memory",
        "forget_user", "undo_job", "add_messages", "end_session"}
    doc = openapi_document(ROUTES)
    for r in ROUTES:
        params = doc["paths"][r.path][r.method.lower()].get("parameters", [])
        assert (IDEMPOTENCY_KEY in {p["name"] for p in params}) == (r.name in WRITES)
