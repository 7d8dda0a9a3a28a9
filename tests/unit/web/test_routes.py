"""The paths of the HTTP API are written once (memstream.contract.http_api.paths): the server's
route table serves exactly them, the Python client calls only them, the inspector's
JavaScript spells the same prefixes, and the client imports none of the server's modules."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memstream.client import AsyncMemoryClient, MemoryClient, Request, Response
from memstream.contract.http_api import paths
from memstream.web.http import ROUTES

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
JS_FOLDER = ROOT / "web" / "inspector"
BASE = "http://memstream.test"
KEY = "sk-tenant-acme-7f3a9c"


def path_constants() -> dict[str, str]:
    """Every path constant of the module (names in capitals, values starting with "/")."""
    return {name: value for name, value in vars(paths).items()
            if name.isupper() and isinstance(value, str) and value.startswith("/")}


def generic(path: str) -> str:
    """A path with every placeholder, Python's or JavaScript's, written ``{}``."""
    return re.sub(r"\$\{[^}]*\}|\{[a-z_]+\}", "{}", path)


def template_of(path: str) -> str | None:
    """The route path a concrete path is an instance of (None: no route)."""
    for route in ROUTES:
        pattern = re.escape(route.path)
        pattern = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", pattern)
        if re.fullmatch(pattern, path):
            return route.path
    return None


# --- the module ---------------------------------------------------------------------
def test_the_public_urls_are_spelled_as_documented():
    assert paths.USER == "/v1/tenants/{tenant}/users/{user}"
    assert paths.SEARCH == "/v1/tenants/{tenant}/users/{user}/search"
    assert paths.MEMORY == "/v1/tenants/{tenant}/users/{user}/memories/{memory_id}"
    assert paths.UNDO_JOB == "/v1/tenants/{tenant}/users/{user}/jobs/{job_id}/undo"
    assert paths.AUDIT == "/v1/tenants/{tenant}/audit"
    assert paths.HEALTH == "/v1/health"
    assert paths.METRICS == "/metrics"
    assert paths.INSPECTOR == "/inspector"


def test_every_served_path_is_a_constant_and_every_constant_is_served():
    served = {route.path for route in ROUTES}
    constants = set(path_constants().values()) - set(paths.PREFIXES)
    assert served == constants == set(paths.ROUTE_PATHS)
    assert len(paths.ROUTE_PATHS) == len(set(paths.ROUTE_PATHS))
    assert not served & set(paths.PREFIXES)
    assert len({(r.method, r.path) for r in ROUTES}) == len(ROUTES)


def test_fill_quotes_what_an_id_cannot_hold_and_nothing_else():
    odd = "a1.b_c:d@e+f=g-h"  # every character an id may hold
    assert paths.fill(paths.SEARCH, tenant="acme", user=odd) == \
        f"/v1/tenants/acme/users/{odd}/search"
    assert paths.fill(paths.AUDIT, tenant="a/b c%") == "/v1/tenants/a%2Fb%20c%25/audit"
    with pytest.raises(ValueError):
        paths.fill(paths.SEARCH, tenant="acme")
    with pytest.raises(ValueError):
        paths.fill(paths.AUDIT, tenant="acme", user="u1")


def test_the_paths_module_and_the_client_import_nothing_of_the_server():
    code = ("import sys, memstream.contract.http_api.paths, memstream.client\n"
            "print('\\n'.join(m for m in sys.modules if m.startswith('memstream.')))")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                            text=True, cwd=ROOT).stdout.split()
    assert "memstream.contract.http_api.paths" in loaded
    assert [m for m in loaded
            if not m.startswith(("memstream.contract.", "memstream.client."))] == [
        "memstream.contract", "memstream.client"]


# --- the client -----------------------------------------------------------------------
CORRECTED = {"status": "done", "job_id": "j1"}
ANSWERS: dict[str, Any] = {
    "search": {"query_id": "q1", "memories": []},
    "context": {"query_id": "q1", "memories": [], "procedural": [], "core": {}, "window": [],
                "prompt_block": ""},
    "list_memories": {"memories": []},
    "tools": {"tools": []},
    "execute_tool": {"name": "memory_search", "status": "ok", "content": "done"},
    "feedback": {"id": "f1"},
    "memory_history": {"memory_id": "m1", "versions": []},
    "memory_source": {"memory_id": "m1", "version": 1, "session_id": "s1", "from_seq": 0,
                      "to_seq": 1, "message_ids": [], "messages": [], "retained": True},
    "change_log": {"changes": []},
    "delete_memory": CORRECTED, "delete_memories": CORRECTED, "rollback_memory": CORRECTED,
    "undo_job": CORRECTED, "forget_user": CORRECTED,
    "tenant_audit": {"entries": []},
    "add_messages": {"messages": []},
    "end_session": {"session_id": "s=1", "topic": "t", "partition": 0, "offset": 0},
}
USER = "u.1:x@y+z=w-v"  # the id characters a URL could escape: sent as they are
MEMORY_ID, JOB_ID, SESSION_ID = "m:1@a", "job=7+b", "s=1"


class Recorder:
    def __init__(self) -> None:
        self.hits: list[tuple[str, str, str]] = []  # method, raw path, route path

    def __call__(self, request: Request) -> Response:
        raw = request.path
        template = template_of(raw)
        assert template is not None, raw
        [route] = [r for r in ROUTES if r.path == template and r.method == request.method]
        self.hits.append((request.method, raw, template))
        return Response(200, json=ANSWERS[route.name])


def call_everything(client: Any) -> None:
    client.search("tea", user_id=USER)
    client.context("tea", user_id=USER)
    client.get_all(user_id=USER)
    client.tools()
    client.execute_tool("memory_search", {"query": "tea"}, user_id=USER)
    client.feedback("q1", MEMORY_ID, user_id=USER, useful=True)
    client.history(MEMORY_ID, user_id=USER)
    client.source(MEMORY_ID, user_id=USER, version=1)
    client.changes(user_id=USER)
    client.delete(MEMORY_ID, user_id=USER)
    client.delete(user_id=USER)
    client.rollback(MEMORY_ID, 1, user_id=USER)
    client.undo_job(JOB_ID, user_id=USER)
    client.forget(user_id=USER)
    client.audit(user_id=USER)
    client.add("hello", user_id=USER, session_id=SESSION_ID)  # no Kafka settings: HTTP
    client.end_session(user_id=USER, session_id=SESSION_ID)


class Synchronous:
    """The async client's coroutines, run one by one on a loop of their own."""

    def __init__(self, client: AsyncMemoryClient, loop: Any) -> None:
        self.client, self.loop = client, loop

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)
        return lambda *a, **kw: self.loop.run_until_complete(method(*a, **kw))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_client_calls_only_paths_of_the_module(kind):
    recorder = Recorder()
    transport = recorder
    if kind == "sync":
        with MemoryClient(BASE, KEY, tenant_id="acme", transport=transport) as client:
            call_everything(client)
    else:
        loop = asyncio.new_event_loop()
        aclient = AsyncMemoryClient(BASE, KEY, tenant_id="acme", transport=transport)
        try:
            call_everything(Synchronous(aclient, loop))
        finally:
            loop.run_until_complete(aclient.aclose())
            loop.close()
    ids = {"tenant": "acme", "user": USER, "memory_id": MEMORY_ID, "job_id": JOB_ID,
           "session_id": SESSION_ID}
    for method, raw, template in recorder.hits:
        assert template in paths.ROUTE_PATHS
        wanted = paths.fill(template, **{n: ids[n] for n in paths.placeholders(template)})
        assert raw == wanted, (method, template)
    called = {(m, t) for m, _, t in recorder.hits}
    assert called == {(r.method, r.path) for r in ROUTES if r.name in ANSWERS}


# --- the inspector's JavaScript ----------------------------------------------------------
def js(name: str) -> str:
    return (JS_FOLDER / name).read_text(encoding="utf-8")


def test_the_inspector_spells_the_user_prefix_as_the_python_constant():
    [body] = re.findall(r'const userPath = \(tail = ""\) =>\s*`([^`]*)`', js("app.js"))
    prefix = (body.replace("${seg(state.tenant)}", "{tenant}")
              .replace("${seg(state.user)}", "{user}").removesuffix("${tail}"))
    assert prefix == paths.USER


def js_calls() -> list[tuple[str, str]]:
    """Every API call of the inspector's scripts: (method, path with ``{}`` placeholders)."""
    found: list[tuple[str, str]] = []
    for name in ("app.js", "metrics.js"):
        code = js(name)
        calls = re.findall(r'\bcall\(\s*"([A-Z]+)",\s*(userPath\(\s*)?(["`])(.*?)\3',
                           code, re.DOTALL)
        assert len(calls) == len(re.findall(r'\bcall\(\s*"', code)), name  # none missed
        for method, user, _, literal in calls:
            path = (paths.USER if user else "") + literal.partition("?")[0]
            found.append((method, generic(path)))
    return found


def test_every_call_of_the_inspector_is_a_route_of_the_table():
    calls = js_calls()
    assert len(calls) >= 10
    served = {(r.method, generic(r.path)) for r in ROUTES}
    assert [c for c in calls if c not in served] == []
    assert ("GET", generic(paths.AUDIT)) in calls
