"""The worker's HTTP layer (memstream.web.http) against a fake backend and fake keys."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import (
    MAX_PAGE,
    ContextRequest,
    ContextResponse,
    ErrorCode,
    MemoryPage,
    SearchRequest,
    ToolCallRequest,
    ToolResult,
)
from memstream.web.http import ROUTES, ApiError, HttpServer, build_http_app
from memstream.web.openapi import error_statuses, openapi_document, success_status
from tests.unit.builders import (
    ADMIN_KEY,
    KEYS,
    SCOPED,
    SCOPED_IDS,
    TENANT_KEY,
    TOOL,
    FakeAuthoriser,
    FakeBackend,
    bearer,
    error_of,
    serve,
)

pytestmark = pytest.mark.unit

def user_path(route: str, tenant: str = "acme", user: str = "u1") -> str:
    """A route of :mod:`memstream.contract.http_api.paths` for one user, the ids put in as given
    (not quoted: some tests send ids that are already %-escaped, or bad on purpose)."""
    return route.format(tenant=tenant, user=user)




# --- keys and tenants -------------------------------------------------------------------
@pytest.mark.parametrize(("method", "route", "body", "_call"), SCOPED, ids=SCOPED_IDS)
async def test_a_missing_key_is_401_and_reaches_nothing(method, route, body, _call):
    async with serve() as (client, backend):
        resp = await client.request(method, user_path(route), json=body)
        await error_of(resp, 401, ErrorCode.UNAUTHORIZED)
        assert resp.headers["WWW-Authenticate"] == "Bearer"
        assert backend.calls == []


@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer not-a-key"}, {"X-API-Key": "not-a-key"},
    {"Authorization": f"Basic {TENANT_KEY}"}, {"Authorization": "Bearer "},
    {"X-API-Key": TENANT_KEY + "x" * 2000},
], ids=["bearer", "x-api-key", "other-scheme", "empty-bearer", "overlong"])
async def test_a_wrong_key_is_401(headers):
    async with serve() as (client, backend):
        resp = await client.post(user_path(paths.SEARCH), json={"query": "tea"}, headers=headers)
        await error_of(resp, 401, ErrorCode.UNAUTHORIZED)
        assert backend.calls == []


@pytest.mark.parametrize("headers", [bearer(), {"X-API-Key": TENANT_KEY},
                                     {"Authorization": f"bearer {TENANT_KEY}"}])
async def test_both_key_headers_are_accepted(headers):
    async with serve() as (client, backend):
        resp = await client.post(user_path(paths.SEARCH), json={"query": "tea"}, headers=headers)
        assert resp.status == 200
        assert [c[:3] for c in backend.calls] == [("search", "acme", "u1")]


@pytest.mark.parametrize(("method", "route", "body", "_call"), SCOPED, ids=SCOPED_IDS)
async def test_a_tenant_key_on_another_tenant_is_403(method, route, body, _call):
    async with serve() as (client, backend):
        resp = await client.request(method, user_path(route, tenant="globex"), json=body,
                                    headers=bearer())
        await error_of(resp, 403, ErrorCode.FORBIDDEN)
        assert backend.calls == []


@pytest.mark.parametrize(("method", "route", "body", "call"), SCOPED, ids=SCOPED_IDS)
async def test_the_admin_key_opens_any_tenant(method, route, body, call):
    async with serve() as (client, backend):
        resp = await client.request(method, user_path(route, tenant="globex", user="u9"),
                                    json=body, headers=bearer(ADMIN_KEY))
        assert resp.status == 200, await resp.text()
        assert [c[:3] for c in backend.calls] == [(call, "globex", "u9")]


async def test_the_key_is_checked_before_the_body_is_read():
    async with serve(max_body=10) as (client, backend):
        resp = await client.post(user_path(paths.SEARCH), data=b"{not json" * 10)
        await error_of(resp, 401, ErrorCode.UNAUTHORIZED)  # not 413, not 400
        assert backend.calls == []


async def test_tools_need_a_valid_key_of_any_tenant():
    async with serve() as (client, _):
        await error_of(await client.get(paths.TOOLS), 401, ErrorCode.UNAUTHORIZED)
        for key in (TENANT_KEY, ADMIN_KEY):
            resp = await client.get(paths.TOOLS, headers={"X-API-Key": key})
            assert resp.status == 200
            assert (await resp.json()) == {"tools": [TOOL]}


# --- path ids, bodies, parameters ----------------------------------------------------------
@pytest.mark.parametrize(("tenant", "user"), [
    ("acme", "bad%20id"), ("acme", "-lead"), ("acme", "u" * 129), ("ac%2Fme", "u1"),
])
async def test_a_bad_path_id_is_400(tenant, user):
    async with serve() as (client, backend):
        resp = await client.post(user_path(paths.SEARCH, tenant, user), json={"query": "tea"},
                                 headers=bearer(ADMIN_KEY))
        assert "id" in await error_of(resp, 400, ErrorCode.BAD_REQUEST)
        assert backend.calls == []


@pytest.mark.parametrize("data", [b"{not json", b"", b"[1, 2]", b'"text"', b"null",
                                  b'{"query": NaN}', b"\xff\xfe{", b"[" * 100_000])
async def test_a_body_that_is_not_a_json_object_is_400(data):
    async with serve(max_body=200_000) as (client, backend):
        resp = await client.post(user_path(paths.SEARCH), data=data, headers=bearer())
        await error_of(resp, 400, ErrorCode.BAD_REQUEST)
        assert backend.calls == []


async def test_an_extra_field_is_400_and_named():
    async with serve() as (client, backend):
        resp = await client.post(user_path(paths.SEARCH), json={"query": "tea", "colour": "red"},
                                 headers=bearer())
        assert "colour" in await error_of(resp, 400, ErrorCode.BAD_REQUEST)
        assert backend.calls == []


@pytest.mark.parametrize("k", [0, 51, "many"])
async def test_k_out_of_range_is_400_without_echoing_the_input(k):
    big = "secret-query " * 250
    async with serve() as (client, backend):
        resp = await client.post(user_path(paths.SEARCH), json={"query": big, "k": k},
                                 headers=bearer())
        message = await error_of(resp, 400, ErrorCode.BAD_REQUEST)
        assert "k" in message and "secret-query" not in message and len(message) <= 300
        assert backend.calls == []


async def test_a_wrong_content_type_is_accepted_when_the_body_parses():
    async with serve() as (client, backend):
        resp = await client.post(user_path(paths.SEARCH), data=b'{"query": "tea"}',
                                 headers={**bearer(), "Content-Type": "text/plain"})
        assert resp.status == 200
        assert backend.calls[0][3] == SearchRequest(query="tea")


async def test_an_oversized_body_by_content_length_is_413():
    async with serve(max_body=1000) as (client, backend):
        resp = await client.post(user_path(paths.SEARCH), json={"query": "x" * 2000},
                                 headers=bearer())
        await error_of(resp, 413, ErrorCode.PAYLOAD_TOO_LARGE)
        assert backend.calls == []


async def test_a_huge_content_length_is_refused_without_waiting_for_the_body():
    async with serve(max_body=1000) as (client, backend):
        reader, writer = await asyncio.open_connection(client.host, client.port)
        writer.write(f"POST {user_path(paths.SEARCH)} HTTP/1.1\r\nHost: t\r\n"
                     f"Authorization: Bearer {TENANT_KEY}\r\nContent-Type: application/json\r\n"
                     "Content-Length: 1000000000\r\n\r\n{".encode())
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout=5)
        writer.close()
        assert status_line.split()[1] == b"413"
        assert backend.calls == []


async def chunks(n: int, size: int = 100) -> AsyncIterator[bytes]:
    yield b'{"query": "'
    for _ in range(n):
        yield b"x" * size
    yield b'"}'


async def test_an_oversized_chunked_body_is_413():
    async with serve(max_body=1000) as (client, backend):
        resp = await client.post(user_path(paths.SEARCH), data=chunks(30), headers=bearer())
        assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
        await error_of(resp, 413, ErrorCode.PAYLOAD_TOO_LARGE)
        assert backend.calls == []


async def test_a_chunked_body_within_the_limit_is_read():
    async with serve(max_body=1000) as (client, backend):
        resp = await client.post(user_path(paths.SEARCH), data=chunks(5), headers=bearer())
        assert resp.status == 200
        assert backend.calls[0][3].query == "x" * 500


async def test_list_parameters_reach_the_backend():
    async with serve() as (client, backend):
        resp = await client.get(user_path(paths.MEMORIES), headers=bearer(), params={
            "limit": "5", "cursor": "abc", "status": "all", "type": "episodic"})
        assert MemoryPage.model_validate(await resp.json()).next_cursor == "next-1"
        resp = await client.get(user_path(paths.MEMORIES), headers=bearer())
        assert resp.status == 200
    assert [c[3] for c in backend.calls] == [
        {"limit": 5, "cursor": "abc", "status": "all", "type": "episodic"},
        {"limit": 100, "cursor": None, "status": None, "type": None}]


@pytest.mark.parametrize("params", [
    {"limit": "0"}, {"limit": str(MAX_PAGE + 1)}, {"limit": "ten"}, {"limit": "-1"},
    {"limit": "1_0"}, {"cursor": "c" * 201}, {"status": "gone"}, {"type": "core"},
])
async def test_bad_list_parameters_are_400(params):
    async with serve() as (client, backend):
        resp = await client.get(user_path(paths.MEMORIES), headers=bearer(), params=params)
        await error_of(resp, 400, ErrorCode.BAD_REQUEST)
        assert backend.calls == []


async def test_requests_reach_the_backend_typed_with_their_tenant_and_user():
    async with serve() as (client, backend):
        body = {"name": "memory_search", "arguments": '{"query": "tea"}', "tool_call_id": "c1"}
        resp = await client.post(user_path(paths.EXECUTE_TOOL, "acme", "u7"), json=body,
                                 headers=bearer())
        result = ToolResult.model_validate(await resp.json())
        resp = await client.post(user_path(paths.CONTEXT, "acme", "u8"), headers=bearer(),
                                 json={"query": "tea", "budget_chars": 500})
        assert ContextResponse.model_validate(await resp.json()).prompt_block == "block"
    assert result.tool_call_id == "c1"
    assert backend.calls == [
        ("execute_tool", "acme", "u7", ToolCallRequest.model_validate(body), KEYS[TENANT_KEY]),
        ("context", "acme", "u8", ContextRequest(query="tea", budget_chars=500))]


# --- errors -----------------------------------------------------------------------------
async def test_an_unknown_route_is_404_json():
    async with serve() as (client, _):
        await error_of(await client.get("/v1/nothing"), 404, ErrorCode.NOT_FOUND)
        await error_of(await client.get("/"), 404, ErrorCode.NOT_FOUND)


async def test_a_wrong_method_is_405_json():
    async with serve() as (client, _):
        resp = await client.get(user_path(paths.SEARCH), headers=bearer())
        await error_of(resp, 405, ErrorCode.METHOD_NOT_ALLOWED)
        assert "POST" in resp.headers["Allow"]
        await error_of(await client.delete(paths.HEALTH), 405, ErrorCode.METHOD_NOT_ALLOWED)


async def test_an_api_error_of_the_backend_passes_through():
    backend = FakeBackend()
    backend.fail = ApiError(404, ErrorCode.NOT_FOUND, "no such memory")
    async with serve(backend) as (client, _):
        resp = await client.post(user_path(paths.FEEDBACK), headers=bearer(),
                                 json={"query_id": "q1", "memory_id": "m9", "useful": False})
        assert await error_of(resp, 404, ErrorCode.NOT_FOUND) == "no such memory"


async def test_a_transient_backend_failure_is_503(caplog):
    backend = FakeBackend()
    backend.fail = ConnectionError("qdrant at 10.0.0.7 refused")
    async with serve(backend) as (client, _):
        resp = await client.post(user_path(paths.SEARCH), json={"query": "tea"}, headers=bearer())
        message = await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        assert "10.0.0.7" not in message and resp.headers["Retry-After"]


async def test_a_crash_is_500_without_detail_and_logged_without_key_or_body(caplog):
    backend = FakeBackend()
    backend.fail = RuntimeError("internal detail /srv/db")
    caplog.set_level(logging.DEBUG)
    async with serve(backend) as (client, _):
        resp = await client.post(user_path(paths.SEARCH), json={"query": "body-text-42"},
                                 headers=bearer())
        message = await error_of(resp, 500, ErrorCode.INTERNAL)
    assert "/srv/db" not in message and "RuntimeError" not in message
    logged = [r for r in caplog.records if r.name == "memstream.web.http"]
    text = logged[0].getMessage() if logged else ""
    assert "search" in text and "Traceback" in text and "RuntimeError" in text  # where
    assert TENANT_KEY not in caplog.text and "body-text-42" not in caplog.text


async def test_health_follows_readiness_and_gates_the_scoped_routes():
    backend = FakeBackend()
    backend.is_ready = False
    async with serve(backend) as (client, _):
        resp = await client.get(paths.HEALTH)
        assert (resp.status, (await resp.json())["status"]) == (503, "starting")
        resp = await client.post(user_path(paths.SEARCH), json={"query": "tea"}, headers=bearer())
        await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        backend.is_ready = True
        resp = await client.get(paths.HEALTH)
        assert (resp.status, (await resp.json())["status"]) == (200, "ok")
    assert backend.calls == []


async def test_a_user_whose_partition_is_being_restored_waits_the_others_do_not():
    class Restoring(FakeBackend):
        def serving(self, tenant: str, user: str) -> bool:
            return user != "u1"

    backend = Restoring()
    async with serve(backend) as (client, _):
        resp = await client.post(user_path(paths.SEARCH), json={"query": "tea"}, headers=bearer())
        assert "restored" in await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        resp = await client.post(user_path(paths.SEARCH, user="other-user"),
                                 json={"query": "tea"}, headers=bearer())
        assert resp.status == 200
    assert [c[:3] for c in backend.calls] == [("search", "acme", "other-user")]


# --- OpenAPI ----------------------------------------------------------------------------
def refs_in(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs_in(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs_in(v) for v in node))
    return set()


async def test_the_openapi_document_matches_the_served_routes():
    doc = openapi_document(ROUTES)
    app = build_http_app(FakeBackend(), FakeAuthoriser(KEYS))
    served = {(r.method.lower(), r.resource.canonical) for r in app.router.routes()
              if r.resource is not None}
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert served == documented and len(served) == len(ROUTES)
    assert doc["openapi"].startswith("3.1") and doc["info"]["version"] == "1"
    schemas = doc["components"]["schemas"]
    assert {r.split("/")[-1] for r in refs_in(doc)} <= set(schemas)
    assert set(doc["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    for route in ROUTES:
        op = doc["paths"][route.path][route.method.lower()]
        assert op["operationId"] == route.name
        ok = str(success_status(route))
        assert {ok, *map(str, error_statuses(route))} <= set(op["responses"])
        if route.body is not None:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/" + route.body.__name__)
        names = {p["name"] for p in op.get("parameters", [])}
        assert {n for n in ("tenant", "user") if "{" + n + "}" in route.path} <= names
    list_op = doc["paths"][paths.MEMORIES]["get"]
    assert {p["name"] for p in list_op["parameters"]} >= {"limit", "cursor", "status", "type"}
    assert doc["paths"][paths.HEALTH]["get"]["security"] == []
    assert "security" not in doc["paths"][paths.TOOLS]["get"]  # the global one applies


async def test_the_openapi_document_is_served_without_a_key():
    async with serve() as (client, _):
        resp = await client.get(paths.OPENAPI)
        assert resp.status == 200
        assert await resp.json() == json.loads(json.dumps(openapi_document(ROUTES)))


# --- serving ----------------------------------------------------------------------------
async def test_the_server_binds_a_free_port_and_stops():
    server = HttpServer(build_http_app(FakeBackend(), FakeAuthoriser(KEYS)), "127.0.0.1", 0)
    await server.start()
    try:
        assert server.port > 0
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{server.port}{paths.HEALTH}") as resp:
            assert (resp.status, (await resp.json())["status"]) == (200, "ok")
    finally:
        await server.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session:
            await session.get(f"http://127.0.0.1:{server.port}{paths.HEALTH}")
