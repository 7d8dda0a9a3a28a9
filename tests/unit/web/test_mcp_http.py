"""The worker's MCP endpoint (/mcp, streamable HTTP) driven by the SDK's own client against
the API app with a fake backend: the keys as the API checks them, the tools run through the
API's own routes (the tenant check, the backend calls), errors as isError results."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from memstream.contract.http_api.api import ContextRequest, Principal
from memstream.contract.http_api.history import (
    CorrectionRequest,
    CorrectionResult,
    HistoryResponse,
    VersionLineage,
    VersionOut,
)
from memstream.core.settings import Settings
from memstream.ops.mcp_stdio import StdioSession, whoami
from memstream.web.http import build_http_app
from memstream.web.http_base import DEPS
from memstream.web.http_checks import authenticate
from memstream.web.mcp_http import MCP_PATH, InApp, McpEndpoint
from memstream.web.mcp_tools import Caller, Refused
from tests.unit.builders import ADMIN_KEY, KEYS, MEMORY, TENANT_KEY, FakeAuthoriser, FakeBackend

pytestmark = pytest.mark.unit


class Backend(FakeBackend):
    async def history(self, tenant: str, user: str, memory_id: str) -> HistoryResponse:
        self._record("history", tenant, user, memory_id)
        lineage = VersionLineage(kind="extraction", job_id="j1", op_id="o1", session_id="s1",
                                 from_seq=0, to_seq=1)
        return HistoryResponse(memory_id=memory_id, versions=[
            VersionOut(**MEMORY.model_dump(), lineage=lineage)])

    async def forget(self, tenant: str, user: str, req: CorrectionRequest,
                     principal: Principal, idempotency_key: str | None = None,
                     ) -> CorrectionResult:
        self._record("forget", tenant, user, req, principal)
        return CorrectionResult(status="done", job_id="forget-1")


APPS: list[web.Application] = []  # the app of the running mcp_server
SEEN: list[str] = []  # what an app middleware saw (the router's place: forwarding)


@web.middleware
async def seen(request: web.Request, handler: Any) -> web.StreamResponse:
    SEEN.append(f"{request.method} {request.path}")
    return await handler(request)


@asynccontextmanager
async def mcp_server(probe: Any = None, **endpoint_args: Any,
                     ) -> AsyncIterator[tuple[str, Backend]]:
    backend = Backend()
    app = build_http_app(backend, FakeAuthoriser(KEYS))
    if probe is not None:
        app.router.add_route("POST", "/probe", probe)
    app.middlewares.append(seen)
    APPS[:] = [app]
    endpoint = McpEndpoint(**endpoint_args)
    endpoint.attach(app)
    await endpoint.start()
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url(MCP_PATH)), backend
    finally:
        await server.close()
        await endpoint.stop()


@asynccontextmanager
async def session(url: str, key: str) -> AsyncIterator[ClientSession]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http, \
            streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write) as s:
        await s.initialize()
        yield s


def text(result: Any) -> str:
    return "\n".join(c.text for c in result.content)


async def test_tools_are_listed_and_run_through_the_api_for_the_keys_tenant():
    async with mcp_server() as (url, backend), session(url, TENANT_KEY) as s:
        names = {t.name for t in (await s.list_tools()).tools}
        assert names == {"search", "context", "add_messages", "memory_insert",
                         "core_memory_replace", "memory_history", "forget_me"}
        result = await s.call_tool("context", {"user_id": "u1", "query": "where do I live"})
        assert not result.is_error and text(result) == "block"
        call = backend.calls[-1]
        assert call[:3] == ("context", "acme", "u1")
        # run through the app's middlewares as a request from the network: forwarding too
        assert SEEN[-2:] == ["POST /mcp", "POST /v1/tenants/acme/users/u1/context"]
        result = await s.call_tool("memory_insert", {"user_id": "u1",
                                                     "content": "Lives in Lisbon."})
        assert not result.is_error and text(result) == "done"
        assert backend.calls[-1][:3] == ("execute_tool", "acme", "u1")
        assert backend.calls[-1][4].key_id == "k-acme"  # the caller's principal
        result = await s.call_tool("add_messages", {"user_id": "u1", "session_id": "s1",
                                                    "messages": [{"role": "user",
                                                                  "content": "hi"}]})
        assert not result.is_error, text(result)
        assert backend.calls[-1][:3] == ("add_messages", "acme", "u1")
        history = await s.call_tool("memory_history", {"user_id": "u1", "memory_id": "m1"})
        assert "likes tea" in text(history)


async def test_another_tenant_and_forget_me_are_refused_for_a_tenant_key():
    async with mcp_server() as (url, backend), session(url, TENANT_KEY) as s:
        other = await s.call_tool("context", {"user_id": "u1", "tenant_id": "globex",
                                              "query": "anything"})
        assert other.is_error and "forbidden" in text(other)
        forget = await s.call_tool("forget_me", {"user_id": "u1"})
        assert forget.is_error and "admin" in text(forget)
        assert backend.calls == []


async def test_the_admin_key_names_its_tenant_and_may_forget():
    async with mcp_server() as (url, backend), session(url, ADMIN_KEY) as s:
        unnamed = await s.call_tool("forget_me", {"user_id": "u1"})
        assert unnamed.is_error and "tenant_id" in text(unnamed)
        done = await s.call_tool("forget_me", {"user_id": "u1", "tenant_id": "globex"})
        assert not done.is_error, text(done)
        assert backend.calls[-1][:3] == ("forget", "globex", "u1")


async def test_a_missing_or_wrong_key_is_401_and_only_post_is_served():
    async with mcp_server() as (url, _), httpx2.AsyncClient() as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        assert (await http.post(url, json=body)).status_code == 401
        wrong = await http.post(url, json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "nope" not in wrong.text
        for method in ("GET", "DELETE"):  # stateless: no stream to open, no session to end
            answer = await http.request(method, url, headers={
                "Authorization": f"Bearer {TENANT_KEY}"}, timeout=10)
            assert answer.status_code == 405


async def test_bad_arguments_and_api_errors_are_tool_errors_without_the_input():
    async with mcp_server() as (url, backend), session(url, TENANT_KEY) as s:
        bad = await s.call_tool("search", {"user_id": "u/1", "query": "PIN 4711"})
        assert bad.is_error and "user_id" in text(bad) and "4711" not in text(bad)
        backend.is_ready = False
        down = await s.call_tool("search", {"user_id": "u1", "query": "PIN 4711"})
        assert down.is_error and text(down).startswith("unavailable") \
            and "4711" not in text(down)


async def test_whoami_names_the_keys_tenant_for_memstream_mcp():
    async with mcp_server() as (url, _):
        base = url.removesuffix(MCP_PATH)
        assert await whoami([base], TENANT_KEY) == KEYS[TENANT_KEY]
        assert (await whoami(["http://127.0.0.1:9", base], ADMIN_KEY)).admin  # next worker
        with pytest.raises(Refused, match="refused"):
            await whoami([base], "wrong-key-0123456789")
    with pytest.raises(Refused, match="reached"):
        await whoami(["http://127.0.0.1:9"], TENANT_KEY)


@pytest.mark.parametrize("kafka", [None, Settings.model_construct(
    bootstrap_servers="broker:9092", topic_prefix="it-abc")])
async def test_memstream_mcp_serves_the_keys_tenant_over_http_or_kafka(kafka):
    async with mcp_server() as (url, _):
        session = StdioSession([url.removesuffix(MCP_PATH)], TENANT_KEY, None, kafka)
        ops, caller = await session.resolve(None)  # type: ignore[arg-type]
        try:
            assert caller == Caller("acme") and ops.client.tenant_id == "acme"
            if kafka is None:  # turns through the HTTP way in
                assert ops.client.bootstrap_servers is None
            else:  # produced with the settings' servers to its topics
                assert ops.client.bootstrap_servers == "broker:9092"
                assert ops.client.topic_prefix == "it-abc"
        finally:
            await session.close()


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "t", "version": "0"}}}
JSON = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_a_browser_origin_is_refused_unless_allowed():
    allowed = "https://agent.example"
    async with mcp_server(allowed_origins=[allowed]) as (url, _backend), \
            httpx2.AsyncClient(headers={**JSON, "Authorization": f"Bearer {TENANT_KEY}"},
                               timeout=10) as http:
        evil = await http.post(url, json=INIT, headers={"Origin": "http://evil.example"})
        assert evil.status_code == 403 and "Origin" in evil.text
        assert "evil" not in evil.text
        ok = await http.post(url, json=INIT, headers={"Origin": allowed})
        assert ok.status_code == 200, ok.text
        plain = await http.post(url, json=INIT)  # agents' HTTP clients send no Origin
        assert plain.status_code == 200 and plain.json()["result"]["protocolVersion"]


async def test_an_unknown_protocol_version_is_answered_with_a_supported_one():
    async with mcp_server() as (url, _), httpx2.AsyncClient(headers={
            **JSON, "Authorization": f"Bearer {TENANT_KEY}"}, timeout=10) as http:
        old = {**INIT, "params": {**INIT["params"], "protocolVersion": "1999-01-01"}}
        answer = (await http.post(url, json=old)).json()["result"]
        assert answer["protocolVersion"] != "1999-01-01"
        assert answer["capabilities"]["tools"] is not None
        assert answer["capabilities"]["resources"] is not None


async def test_oversized_bodies_and_a_keys_request_rate_are_refused():
    async with mcp_server() as (url, _backend), httpx2.AsyncClient(headers={
            **JSON, "Authorization": f"Bearer {TENANT_KEY}"}, timeout=10) as http:
        big = await http.post(url, content=b'{"x": "' + b"a" * 70_000 + b'"}')
        assert big.status_code == 413
        APPS[0][DEPS].guard.limit_requests(0.001, 2)
        answers = [(await http.post(url, json=INIT)).status_code for _ in range(3)]
        assert answers == [200, 200, 429]
        other = await http.post(url, json=INIT, headers={
            "Authorization": f"Bearer {ADMIN_KEY}"})  # another key: its own rate
        assert other.status_code == 200


async def test_a_retried_add_messages_sends_the_same_ids_through_the_api():
    args = {"user_id": "u1", "session_id": "s1", "turn_id": "3",
            "messages": [{"role": "user", "content": "I moved to Porto"}]}
    async with mcp_server() as (url, backend), session(url, TENANT_KEY) as s:
        first = await s.call_tool("add_messages", args)
        again = await s.call_tool("add_messages", args)  # the client's retry on a timeout
        assert not first.is_error and not again.is_error
        ids = first.structured_content["message_ids"]
        assert again.structured_content["message_ids"] == ids and ids[0].startswith("m-")
        sent = [call[3].messages[0].message_id for call in backend.calls]
        assert sent == ids * 2  # the worker (and the ingest stage's dedup) sees one id
        assert all(backend.idempotency_keys)  # the write went through ingress's keying


PROBED: list[str] = []  # what InApp answered in the probe route


async def probe(request: web.Request) -> web.StreamResponse:
    """InApp over a keyed request, asked past the MCP layer's own tenant check."""
    authenticate(request)
    ops = InApp(request)
    for tenant in ("globex", "acme"):
        try:
            found = await ops.context(tenant, "u1", ContextRequest(query="x"))
            PROBED.append(f"{tenant}: ok {found.prompt_block}")
        except Refused as exc:
            PROBED.append(f"{tenant}: {exc}")
    return web.Response(text="done")


async def test_the_in_process_dispatch_is_the_apps_own():
    """``dispatch`` relies on aiohttp's private ``Application._handle(request)`` (see its
    doc): an aiohttp that changes it fails here, not in production. Through it a tool's
    request meets the routes' own checks (the tenant: 403), whatever the MCP layer
    checked before, and the readiness check (503)."""
    assert list(inspect.signature(web.Application._handle).parameters) == ["self", "request"]
    async with mcp_server(probe=probe) as (url, backend), httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {TENANT_KEY}"}, timeout=10) as http:
        PROBED.clear()
        assert (await http.post(url.replace(MCP_PATH, "/probe"))).status_code == 200
        assert PROBED == ["globex: forbidden: this key does not open this tenant",
                          "acme: ok block"]
        backend.is_ready = False
        PROBED.clear()
        await http.post(url.replace(MCP_PATH, "/probe"))
        assert PROBED[1].startswith("acme: unavailable")
        assert [c[1] for c in backend.calls] == ["acme"]


async def test_no_key_and_no_memory_content_reach_the_logs(caplog):
    caplog.set_level(logging.DEBUG)  # every logger, the SDK's too, at its most verbose
    secret = "Ana's PIN is 4711-secret"
    async with mcp_server() as (url, backend), session(url, TENANT_KEY) as s:
        await s.call_tool("add_messages", {"user_id": "u1", "session_id": "s1",
                                           "messages": [{"role": "user", "content": secret}]})
        await s.call_tool("memory_insert", {"user_id": "u1", "content": secret})
        await s.call_tool("search", {"user_id": "u1", "query": secret})
        await s.call_tool("search", {"user_id": "u/1", "query": secret})  # refused
        backend.fail = RuntimeError("store down")
        failed = await s.call_tool("context", {"user_id": "u1", "query": secret})
        assert failed.is_error and secret not in text(failed)
    async with mcp_server() as (url, _), httpx2.AsyncClient(headers={
            **JSON, "Authorization": f"Bearer {TENANT_KEY}"}, timeout=10) as http:
        for body in (json.dumps([{"query": secret}]), '{"jsonrpc": "2.0", "q": "' + secret):
            assert (await http.post(url, content=body)).status_code == 400  # no batches
    server = [r for r in caplog.records  # the test's own client logs what it sends
              if not r.name.startswith(("mcp.client", "httpx", "httpcore"))]
    logged = "\n".join(f"{r.getMessage()} {r.exc_info or ''}" for r in server)
    assert "mcp.server" in {r.name.rpartition(".")[0] for r in server}  # the SDK's own
    assert TENANT_KEY not in logged and "4711" not in logged


async def test_whoami_tells_whom_the_key_opens_and_nothing_more():
    async with mcp_server() as (url, _), httpx2.AsyncClient(timeout=10) as http:
        base = url.removesuffix(MCP_PATH)
        mine = await http.get(base + "/v1/whoami",
                              headers={"Authorization": f"Bearer {TENANT_KEY}"})
        # the key id is the public part of the key its caller presented (keys are revoked
        # by it); no secret, no digest, no other key or tenant
        assert mine.json() == {"key_id": "k-acme", "tenant_id": "acme", "admin": False}
        assert TENANT_KEY not in mine.text
        assert (await http.get(base + "/v1/whoami")).status_code == 401
