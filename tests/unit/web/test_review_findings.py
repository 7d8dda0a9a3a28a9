"""The HTTP side of the security review's findings (issue 47, item 6): absolute-form request
targets are 400 and forwards go to URLs made of the verified base and the re-encoded path;
an invalid owner URL is never "the owner is down"; each key has a request rate (429 to that
key only, on every route that takes a key); the failed-login limit never refuses a valid
key; a malformed credential of any kind is 401, never 500.

Requests with bytes a client library would not send (an absolute target, non-UTF-8 header
bytes) go over a raw socket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from yarl import URL

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import ErrorCode
from memstream.core.cluster_auth import CREDENTIAL_HEADER
from memstream.memory.store.partitioned import PartitionedStore, partition_of
from memstream.streams.cluster import Cluster, ClusterMap, Worker
from memstream.streams.counters import Counters
from memstream.web.forwarding import FORWARDED, PRINCIPAL_HEADER, TO, forward_target, forward_url
from memstream.web.http import build_http_app
from memstream.web.http_base import DEPS, KeyRate, LoginGuard
from memstream.web.http_checks import scope
from memstream.web.prometheus import METRICS, MetricsDeps, summary
from memstream.web.routing import SERVED_BY, STANDBY, Router
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
METRICS_KEY = "metrics-key-0123456789"
OTHER_KEY = "key-acme-second-0123456789"


def at(route: str) -> str:
    return paths.fill(route, tenant=TENANT, user=USER)


async def raw(server: TestServer, request_line: bytes, *headers: bytes) -> tuple[int, bytes]:
    """Status and body of one request sent as these exact bytes."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(request_line + b"\r\nHost: h\r\n" + b"".join(h + b"\r\n" for h in headers)
                     + b"Connection: close\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


@asynccontextmanager
async def a_and_b(b_url: str | None = None) -> AsyncIterator[tuple[TestServer, Router, list[str]]]:
    """A (the real app, a standby of every partition) routes every partition to B (a bare
    app recording the targets it gets; ``b_url`` overrides its URL in A's map)."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request.raw_path)
        return web.json_response({"from": "B"})

    owner = web.Application()
    owner.router.add_route("*", "/{tail:.*}", handle)
    b_server = TestServer(owner)
    await b_server.start_server()
    store = PartitionedStore(lambda t, u: partition_of(t, u, PARTITIONS))
    for n in range(PARTITIONS):
        store.standby[n] = object()  # type: ignore[assignment]
    router = Router(Cluster(Worker("A", "http://a.invalid")), PARTITIONS, store, secret=SECRET)
    app = build_http_app(FakeBackend(), FakeAuthoriser(KEYS), router=router)  # type: ignore[arg-type]
    url = b_url or f"http://{b_server.host}:{b_server.port}"
    router.cluster.update("apply", ClusterMap(workers={"A": "http://a.invalid", "B": url},
                                              owners={n: "B" for n in range(PARTITIONS)}))
    server = TestServer(app)
    await server.start_server()
    try:
        yield server, router, seen
    finally:
        await router.close()
        await server.close()
        await b_server.close()


# --- b. absolute-form targets; forward URLs --------------------------------------------------
@pytest.mark.parametrize("target", [
    b"http://x/v1/tenants/acme/users/u1/memories",
    b"http://127.0.0.1/v1/tenants/acme/users/u1/memories"])
async def test_an_absolute_form_target_is_400_never_forwarded_nor_a_standby_read(target):
    async with a_and_b() as (server, router, seen):
        status, body = await raw(server, b"GET " + target + b" HTTP/1.1",
                                 f"Authorization: Bearer {TENANT_KEY}".encode())
        assert status == 400, body
        assert b"bad_request" in body
        assert seen == [] and (router.forwarded, router.failed, router.standby_served) == (0, 0, 0)
        # the same path in origin form is forwarded, to the path alone
        status, body = await raw(server, b"GET " + at(paths.MEMORIES).encode() + b" HTTP/1.1",
                                 f"Authorization: Bearer {TENANT_KEY}".encode())
        assert status == 200 and seen == [at(paths.MEMORIES)], body


async def test_an_owner_url_that_cannot_be_used_is_503_and_never_a_standby_read():
    async with a_and_b(b_url="http://b.example:notaport") as (server, router, seen):
        async with TestClient(server) as client:
            resp = await client.get(at(paths.MEMORIES), headers=bearer())
            await error_of(resp, 503, ErrorCode.UNAVAILABLE)
            assert STANDBY not in resp.headers and SERVED_BY not in resp.headers
        assert router.standby_served == 0 and router.failed == 0 and seen == []


@pytest.mark.parametrize("base", ["http://owner", "http://owner:8000", "https://owner/",
                                  "http://owner/prefix"])
@pytest.mark.parametrize("path", ["//evil.example/v1/x", "/v1/tenants/a/users/@evil.example",
                                  "/v1/a b/%2F?", "/v1/x:80@evil"])
def test_a_forward_url_keeps_the_verified_host_and_re_encodes_the_path(base, path):
    target = URL.build(path=path, query={"cursor": "a&b=c", "limit": "5"})
    url = forward_url(base, target)
    parsed = URL(base)
    assert (url.scheme, url.host, url.port) == (parsed.scheme, "owner", parsed.port)
    assert url.path == parsed.path.rstrip("/") + path
    assert dict(url.query) == {"cursor": "a&b=c", "limit": "5"}
    assert url.raw_path_qs.endswith(target.raw_path_qs)


def test_the_signed_target_is_the_re_encoded_parsed_path_never_the_raw_one():
    from aiohttp.test_utils import make_mocked_request

    request = make_mocked_request("GET", "/v1/tenants/a/users/u1/memories?cursor=a%26b&x=%20")
    target = forward_target(request)
    assert target.raw_path_qs == "/v1/tenants/a/users/u1/memories?cursor=a%26b&x=+"
    assert dict(target.query) == {"cursor": "a&b", "x": " "}


# --- c. a request rate per key -----------------------------------------------------------------
def rated_app(now: list[float]) -> web.Application:
    keys = {**KEYS, OTHER_KEY: KEYS[TENANT_KEY].model_copy(update={"key_id": "k-acme-2"})}
    app = build_http_app(FakeBackend(), FakeAuthoriser(keys),  # type: ignore[arg-type]
                         clock=lambda: now[0])
    app[DEPS].guard.limit_requests(1.0, 2)

    async def added_later(request: web.Request) -> web.StreamResponse:  # a route another
        scope(request)  # module adds: it authenticates by the shared path
        return web.json_response({})

    app.router.add_route("POST", "/v1/tenants/{tenant}/users/{user}/later", added_later)
    return app


async def test_a_key_over_its_request_rate_is_429_and_no_other_key_is():
    now = [100.0]
    app = rated_app(now)
    async with TestClient(TestServer(app)) as client:
        for _ in range(2):  # the burst
            assert (await client.get(at(paths.MEMORIES), headers=bearer())).status == 200
        resp = await client.post(at(paths.SEARCH), json={"query": "tea"}, headers=bearer())
        await error_of(resp, 429, ErrorCode.RATE_LIMITED)
        assert resp.headers["Retry-After"] == "1"
        later = f"/v1/tenants/{TENANT}/users/{USER}/later"
        await error_of(await client.post(later, headers=bearer()), 429, ErrorCode.RATE_LIMITED)
        other = await client.get(at(paths.MEMORIES), headers=bearer(OTHER_KEY))
        assert other.status == 200, await other.text()
        assert (await client.post(later, headers=bearer(OTHER_KEY))).status == 200
        now[0] += 1.0  # one token back
        assert (await client.get(at(paths.MEMORIES), headers=bearer())).status == 200
        await error_of(await client.get(at(paths.MEMORIES), headers=bearer()), 429,
                       ErrorCode.RATE_LIMITED)
    assert app[DEPS].guard.counts["request_rate"] == 3
    assert app[DEPS].guard.counts["unknown_key"] == 0  # a limited key is no failed login


def test_the_request_buckets_are_bounded():
    now = [0.0]
    rate = KeyRate(1.0, 1, lambda: now[0], most=5)
    for n in range(50):
        assert rate.take(f"k{n}") is None
    assert len(rate._buckets) == 5
    assert rate.take("k49") == pytest.approx(1.0)


# --- d. the failed-login limit never refuses a valid key ----------------------------------------
def test_the_failed_login_limit_refuses_failures_only_and_is_bounded():
    from unittest import mock

    from aiohttp.test_utils import make_mocked_request

    from memstream.web.http_base import ApiError
    from memstream.web.http_checks import check_key

    app = build_http_app(FakeBackend(), FakeAuthoriser(KEYS),  # type: ignore[arg-type]
                         login_failures_per_minute=2)

    def check(key: str, address: str = "10.0.0.1") -> int:
        transport = mock.Mock()
        transport.get_extra_info.return_value = (address, 40000)
        request = make_mocked_request("GET", "/", app=app, transport=transport)
        try:
            check_key(request, key, app[DEPS].authoriser.authorise)
        except ApiError as exc:
            return exc.status
        return 200

    assert [check(f"wrong-{n}") for n in range(4)] == [401, 401, 429, 429]  # one NAT
    assert check(TENANT_KEY) == 200 and check(ADMIN_KEY) == 200  # the same NAT
    assert check("wrong-x", "10.0.0.2") == 401
    guard = LoginGuard(2, lambda: 0.0, most=4)
    for n in range(100):
        guard.failed(f"addr:{n}", f"key:{n}")
    assert len(guard._failed) == 4


# --- e. malformed credentials are 401 -----------------------------------------------------------
MALFORMED = [
    b"Authorization: Bearer \xd0\xba\xd0\xbb\xd1\x8e\xd1\x87",  # "ключ", UTF-8
    b"Authorization: Bearer \xff\xfe-not-utf-8",  # not UTF-8, not a latin-1 key either
    b"X-API-Key: \xd0\xba\xd0\xbb\xd1\x8e\xd1\x87",
    b"X-API-Key: key\xc3\x28-broken",
    b"Authorization: Bearer key\tinside",  # a control character
]


@pytest.mark.parametrize("header", MALFORMED, ids=range(len(MALFORMED)))
@pytest.mark.parametrize("route", [at(paths.MEMORIES), paths.TOOLS, paths.METRICS,
                                   paths.METRICS_SUMMARY, paths.CLUSTER])
async def test_a_malformed_key_is_401_never_500(header, route):
    router = Router(Cluster(Worker("B", "http://b.invalid")), PARTITIONS, secret=SECRET)
    app = build_http_app(FakeBackend(), FakeAuthoriser(KEYS), router=router)  # type: ignore[arg-type]

    async def refresh() -> None:
        return None

    counters = Counters()
    app[METRICS] = MetricsDeps(CollectorRegistry(), METRICS_KEY,
                               lambda: summary(counters, time.time()), refresh,
                               cluster=lambda: {"worker": "B"})
    server = TestServer(app)
    await server.start_server()
    try:
        status, body = await raw(server, f"GET {route} HTTP/1.1".encode(), header)
    finally:
        await server.close()
        await router.close()
    assert status == 401, body


@pytest.mark.parametrize("signature", [b"\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87", b"\xff\xfe",
                                       b"ab\xd0\xba"])
@pytest.mark.parametrize("worker", [b"A", b"\xd0\x90", b"\xff"])
async def test_a_malformed_worker_credential_is_401_never_500(signature, worker):
    credential = f"v1 {time.time():.3f} 0123abcd ".encode() + signature
    router = Router(Cluster(Worker("B", "http://b.invalid")), PARTITIONS, secret=SECRET)
    router.cluster.update("apply", ClusterMap(workers={"B": "http://b.invalid"},
                                              owners={n: "B" for n in range(PARTITIONS)}))
    app = build_http_app(FakeBackend(), FakeAuthoriser(KEYS), router=router)  # type: ignore[arg-type]
    server = TestServer(app)
    await server.start_server()
    principal = KEYS[TENANT_KEY].model_dump_json().encode()
    try:
        status, body = await raw(
            server, f"GET {at(paths.MEMORIES)} HTTP/1.1".encode(),
            CREDENTIAL_HEADER.encode() + b": " + credential, FORWARDED.encode() + b": " + worker,
            TO.encode() + b": B", PRINCIPAL_HEADER.encode() + b": " + principal)
    finally:
        await server.close()
        await router.close()
    assert status == 401, body
