"""The isolation suite over every keyed route of the HTTP table (SPEC §7), generated from
:data:`memstream.web.http.ROUTES`, so a route added later is covered without a new
test: no key → 401, another tenant's key → 403, an odd id in any path parameter → 400,
and in each case the backend is never reached; the operators' residue view refuses tenant
keys; a correction always names the path's own tenant and user to the backend."""

from __future__ import annotations

import re
from typing import Any

import pytest

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import ErrorCode, Principal
from memstream.contract.http_api.history import (
    AuditPage,
    ChangePage,
    CorrectionRequest,
    CorrectionResult,
    HistoryResponse,
    Residue,
    SourceResponse,
)
from memstream.topics.schemas import ToolWrite
from memstream.web.http import ROUTES
from memstream.web.openapi import success_status
from tests.unit.builders import ADMIN_KEY, FakeBackend, bearer, error_of, serve

pytestmark = pytest.mark.unit

BODIES: dict[str, dict[str, Any] | None] = {
    "search": {"query": "tea"}, "context": {"query": "tea"},
    "feedback": {"query_id": "q1", "memory_id": "m1", "useful": True},
    "execute_tool": {"name": "memory_search", "arguments": {"query": "tea"}},
    "rollback_memory": {"version": 1}, "forget_user": {"reason": "asked"},
    "add_messages": {"session_id": "s1", "messages": [{"role": "user", "content": "hi"}]},
}
SCOPED = [r for r in ROUTES if "{tenant}" in r.path and r.keyed]
ODD_IDS = ["..", "a/b", "-lead", "x" * 129, "%09tab", "sp%20ace", "%2e%2e", "%C3%BC"]


class GovBackend(FakeBackend):
    async def history(self, tenant: str, user: str, memory_id: str) -> HistoryResponse:
        self._record("history", tenant, user, memory_id)
        return HistoryResponse(memory_id=memory_id, versions=[])

    async def source(self, tenant: str, user: str, memory_id: str,
                     version: int | None) -> SourceResponse:
        self._record("source", tenant, user, memory_id)
        return SourceResponse(memory_id=memory_id, version=1, session_id="s", from_seq=0,
                              to_seq=1, message_ids=[], messages=[], retained=False)

    async def changes(self, tenant: str, user: str, *, limit: int,
                      cursor: str | None) -> ChangePage:
        self._record("changes", tenant, user)
        return ChangePage(changes=[])

    async def correct(self, tenant: str, user: str, write: ToolWrite, req: CorrectionRequest,
                      principal: Principal,
                      idempotency_key: str | None = None) -> CorrectionResult:
        self._record("correct", tenant, user, write.name, write.target_id, write.all_memories)
        return CorrectionResult(status="done", job_id="j1")

    async def forget(self, tenant: str, user: str, req: CorrectionRequest,
                     principal: Principal,
                     idempotency_key: str | None = None) -> CorrectionResult:
        self._record("forget", tenant, user)
        return CorrectionResult(status="done", job_id="j1")

    async def audit(self, tenant: str, *, limit: int, cursor: str | None, user: str | None,
                    kind: str | None) -> AuditPage:
        self._record("audit", tenant, user)
        return AuditPage(entries=[])

    async def residue(self, tenant: str, user: str) -> Residue:
        self._record("residue", tenant, user)
        return Residue(store_records=0)


def path_of(route: Any, tenant: str = "acme", user: str = "u1", other: str = "m1") -> str:
    out = route.path.replace("{tenant}", tenant).replace("{user}", user)
    return re.sub(r"\{[a-z_]+\}", other, out)


def request_of(route: Any, **ids: str) -> dict[str, Any]:
    return {"method": route.method, "path": path_of(route, **ids),
            "json": BODIES.get(route.name)}


@pytest.mark.parametrize("route", SCOPED, ids=[r.name for r in SCOPED])
async def test_every_scoped_route_refuses_missing_and_foreign_keys(route):
    async with serve(GovBackend()) as (client, backend):
        await error_of(await client.request(**request_of(route)), 401, ErrorCode.UNAUTHORIZED)
        foreign = request_of(route, tenant="globex")
        await error_of(await client.request(**foreign, headers=bearer()), 403,
                       ErrorCode.FORBIDDEN)
        assert backend.calls == []


@pytest.mark.parametrize("route", SCOPED, ids=[r.name for r in SCOPED])
@pytest.mark.parametrize("odd", ODD_IDS)
async def test_every_path_id_is_checked(route, odd):
    names = re.findall(r"\{([a-z_]+)\}", route.path)
    async with serve(GovBackend()) as (client, backend):
        for name in names:
            ids = {"tenant": "acme", "user": "u1", "other": "m1"}
            ids["other" if name not in ("tenant", "user") else name] = odd
            resp = await client.request(**request_of(route, **ids), headers=bearer(ADMIN_KEY))
            assert resp.status in (400, 404), (name, resp.status)  # 404: "/" split the path
        assert backend.calls == []


@pytest.mark.parametrize("route", SCOPED, ids=[r.name for r in SCOPED])
async def test_the_backend_is_asked_for_the_paths_own_tenant_and_user(route):
    async with serve(GovBackend()) as (client, backend):
        resp = await client.request(**request_of(route, tenant="globex", user="u9"),
                                    headers=bearer(ADMIN_KEY))
        assert resp.status == success_status(route), await resp.text()
        [call] = backend.calls
        expected = ("globex", "u9") if "{user}" in route.path else ("globex", None)
        assert call[1:3] == expected


async def test_the_residue_view_is_for_operators_only():
    [route] = [r for r in ROUTES if r.name == "user_residue"]
    async with serve(GovBackend()) as (client, backend):
        resp = await client.get(path_of(route), headers=bearer())
        await error_of(resp, 403, ErrorCode.FORBIDDEN)
        assert backend.calls == []


async def test_deleting_all_never_names_a_memory_and_one_never_means_all():
    async with serve(GovBackend()) as (client, backend):
        every = paths.fill(paths.MEMORIES, tenant="acme", user="u1")
        one = paths.fill(paths.MEMORY, tenant="acme", user="u1", memory_id="m7")
        assert (await client.delete(every, headers=bearer())).status == 200
        assert (await client.delete(one, headers=bearer())).status == 200
    assert [c[3:] for c in backend.calls] == [("delete", "", True), ("delete", "m7", False)]
