"""The MCP server end to end, on both transports, driven by the SDK's own client: a real
broker, one worker serving the API (and /mcp), tenant keys from the keys topic.

- streamable HTTP: the SDK's client against the worker's ``/mcp`` with a Bearer tenant key;
- stdio: ``memstream mcp`` spawned by the SDK's stdio client, talking to the worker's API
  (and with ``--kafka``, producing the turns to the messages topic itself).

On each: the tools are listed, a turn is added, a barrier waits until its memory exists
(``search``), ``context`` shows it; another tenant's user and ``forget_me`` are refused for
a tenant key, and another tenant's key finds nothing of it. Barriers, never sleeps."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import pytest_asyncio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from memstream.contract.http_api import paths
from memstream.core.settings import Settings
from memstream.web.mcp_http import MCP_PATH
from tests.integration.conftest import answering, free_port, running, tenant_key, until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ADMIN = "admin-key-48-0123456789abcdef0123456789"
PORT = free_port()
BASE = f"http://127.0.0.1:{PORT}"
TOOLS = {"search", "context", "add_messages", "memory_insert", "core_memory_replace",
         "memory_history", "forget_me"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("mcp"),
                       extract_enabled=True, web_enabled=True, web_port=PORT,
                       admin_key=ADMIN) as h:
        await answering(BASE, ADMIN, paths.TOOLS, "the API to answer", timeout=120)
        yield h


async def key_of(h, tenant: str) -> str:
    """A new key of ``tenant``, once the worker takes it."""
    return await tenant_key(h, BASE, tenant, paths.WHOAMI)


@asynccontextmanager
async def over_http(key: str) -> AsyncIterator[ClientSession]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"},
                                  timeout=60) as http, \
            streamable_http_client(BASE + MCP_PATH, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def over_stdio(key: str, kafka: Settings | None = None) -> AsyncIterator[ClientSession]:
    """``memstream mcp``; with ``kafka``: ``--kafka``, turns produced with those settings."""
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT)),
           "MEMSTREAM_URL": BASE, "MEMSTREAM_API_KEY": key}
    if kafka is not None:
        env |= {"MEMSTREAM_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                "MEMSTREAM_TOPIC_PREFIX": kafka.topic_prefix}
    params = StdioServerParameters(
        command=sys.executable, cwd=str(ROOT), env=env,
        args=["-m", "memstream.cli", "mcp", *(["--kafka"] if kafka else [])])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def text(result: Any) -> str:
    return "\n".join(c.text for c in result.content)


async def remembers(session: ClientSession, tenant: str, user: str, city: str) -> None:
    """A turn added, its memory awaited, then seen in ``context``."""
    assert {t.name for t in (await session.list_tools()).tools} == TOOLS
    turn = {"user_id": user, "session_id": "s1",
            "messages": [{"role": "user", "content": f"Remember that I live in {city}"}]}
    added = await session.call_tool("add_messages", turn)
    assert not added.is_error, text(added)
    again = await session.call_tool("add_messages", turn)  # a client's retry: the same ids
    assert again.structured_content == added.structured_content, text(again)

    async def memory() -> Any:  # memories only: not the raw turn
        found = await session.call_tool("search", {"user_id": user,
                                                   "query": "where does the user live"})
        if found.is_error:  # a partition still being restored: retry, as an agent would
            assert text(found).startswith("unavailable"), text(found)
            return None
        return found if city in text(found) else None

    found = await until(memory, "the memory", timeout=90)
    assert f"Lives in {city}" in text(found)
    memory_id = found.structured_content["memories"][0]["memory_id"]
    history = await session.call_tool("memory_history", {"user_id": user,
                                                         "memory_id": memory_id})
    assert not history.is_error and f"Lives in {city}" in text(history), text(history)
    context = await session.call_tool("context", {"user_id": user,
                                                  "query": "where does the user live"})
    assert not context.is_error and f"Lives in {city}" in text(context)
    assert context.structured_content["memory_ids"]


async def refuses_other_tenants(session: ClientSession, other: str, user: str) -> None:
    foreign = await session.call_tool("context", {"user_id": user, "tenant_id": other,
                                                  "query": "where does the user live"})
    assert foreign.is_error and "forbidden" in text(foreign)
    forget = await session.call_tool("forget_me", {"user_id": user})
    assert forget.is_error and "admin" in text(forget)
    with pytest.raises(MCPError, match="forbidden"):
        await session.read_resource(f"memstream://tenants/{other}/users/{user}/profile")
    own = await session.read_resource(f"memstream://users/{user}/core-memory")
    assert own.contents[0].uri == f"memstream://users/{user}/core-memory"


async def knows_nothing(key: str, user: str, city: str) -> None:
    """Another tenant's key: the same user id is another user, with no such memory."""
    async with over_http(key) as session:
        found = await session.call_tool("search", {"user_id": user, "query": "where"})
        assert not found.is_error and city not in text(found)


@pytest.mark.parametrize(("transport", "user", "city"), [
    ("http", "ana", "Lisbon"), ("stdio", "ben", "Porto"), ("stdio-kafka", "cy", "Madrid")],
    ids=["http", "stdio", "stdio-kafka"])
async def test_a_turn_becomes_memory_and_other_tenants_are_refused(api, tenant, transport,
                                                                   user, city):
    key = await key_of(api, tenant)
    connect = {"http": over_http, "stdio": over_stdio,
               "stdio-kafka": lambda k: over_stdio(k, api.settings)}[transport]
    async with connect(key) as session:
        await remembers(session, tenant, user, city)
        await refuses_other_tenants(session, tenant + "x", user)
    await knows_nothing(await key_of(api, tenant + "x"), user, city)
    async with over_http(ADMIN) as session:  # the operator's key may forget the user
        done = await session.call_tool("forget_me", {"user_id": user, "tenant_id": tenant})
        assert not done.is_error and "failed" not in text(done), text(done)


async def test_the_endpoint_takes_keys_as_the_api_does(api):
    async with httpx.AsyncClient(base_url=BASE) as web:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        assert (await web.post(MCP_PATH, json=body)).status_code == 401
        wrong = await web.post(MCP_PATH, json=body, headers={"Authorization": "Bearer msk_x"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
