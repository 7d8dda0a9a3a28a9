"""History, lineage and corrections end to end: a real broker, one worker serving the HTTP
API, the Python client. Deletes, rollbacks and undos are jobs of the user: each call waits
for the apply agent and the change events land on the memory-change topic, so a rebuild
from the topic holds the corrected memories. Every test has its own tenant on the module's
shared worker and waits on barriers (job results, API answers), never on fixed sleeps."""

from __future__ import annotations

import pytest
import pytest_asyncio

from memstream.client import AsyncMemoryClient, MemstreamAPIError
from memstream.memory.store import Scope
from memstream.web.keys_topic import create_key
from tests.integration.conftest import free_port, rebuild, remembered, running, until

pytestmark = pytest.mark.integration
ADMIN = "admin-key-gov-0123456789abcdef012345"
PORT = free_port()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gov(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("gov"), extract_enabled=True,
                       web_enabled=True, web_port=PORT, admin_key=ADMIN) as h:
        probe = AsyncMemoryClient(f"http://127.0.0.1:{PORT}", ADMIN, tenant_id="probe")
        await until(lambda: probe.tools(), "the API to answer", timeout=120)
        await probe.aclose()
        yield h


def client(h, tenant: str, key: str = ADMIN) -> AsyncMemoryClient:
    return AsyncMemoryClient(f"http://127.0.0.1:{PORT}", key, tenant_id=tenant,
                             bootstrap_servers=h.settings.bootstrap_servers,
                             topic_prefix=h.settings.topic_prefix)


async def live(c: AsyncMemoryClient, user: str) -> dict[str, str]:
    return {m.content: m.memory_id for m in await c.get_all(user_id=user)}


async def test_delete_history_rollback_round_trip(gov, tenant):
    async with client(gov, tenant) as c:
        await remembered(gov, c, tenant, "ana", "s1",
                         ["Remember this: I live in Lisbon", "I am allergic to penicillin"])
        mine = await live(c, "ana")
        lisbon = mine["Lives in Lisbon"]
        deleted = await c.delete(lisbon, user_id="ana", reason="moved away, not true")
        assert deleted.status == "done"
        assert [(x.op, x.memory_id) for x in deleted.changes] == [("delete", lisbon)]
        assert "Lives in Lisbon" not in await live(c, "ana")
        found = await c.search("where do I live?", user_id="ana")
        assert lisbon not in [m.memory_id for m in found.memories]
        history = await c.history(lisbon, user_id="ana")
        [v1] = history.versions
        assert (v1.status, v1.lineage.kind, v1.lineage.session_id) == ("deleted", "extraction",
                                                                      "s1")
        source = await c.source(lisbon, user_id="ana")
        assert [m.content for m in source.messages] == ["Remember this: I live in Lisbon"]
        assert source.retained
        restored = await c.rollback(lisbon, 1, user_id="ana")
        assert [(x.op, x.version) for x in restored.changes] == [("add", 2)]
        assert (await live(c, "ana"))["Lives in Lisbon"] == lisbon
        log = await c.changes(user_id="ana")
        assert [(x.memory_id, x.version, x.status) for x in log][:2] == [
            (lisbon, 2, "active"), (lisbon, 1, "deleted")]
        missing = await c.rollback(lisbon, 9, user_id="ana")
        assert missing.status == "failed" and "no version 9" in (missing.error or "")
        with pytest.raises(MemstreamAPIError) as unknown:
            await c.history("no-such-memory", user_id="ana")
        assert unknown.value.status == 404
        async def audited():
            rows = await c.audit(user_id="ana")
            return rows if {"deletion", "rollback"} <= {r.kind for r in rows} else None

        rows = await until(audited, "the corrections in the tenant's audit log")
        assert [(r.op, r.kind, r.actor) for r in rows][:2] == [
            ("add", "rollback", "admin"), ("delete", "deletion", "admin")]
        assert "Lisbon" not in repr(rows)  # who did what, when: never content
    store, changes = await rebuild(gov, tenant)  # from the memory-change topic alone
    rebuilt = {m.content: m.memory_id for m in store.list(Scope(tenant, "ana"))}
    assert rebuilt["Lives in Lisbon"] == lisbon
    kinds = [(c.op, c.lineage.kind) for c in changes if c.memory_id == lisbon]
    assert kinds == [("add", "extraction"), ("delete", "deletion"), ("add", "rollback")]


async def test_undo_a_job_restores_what_it_replaced(gov, tenant):
    async with client(gov, tenant) as c:
        await remembered(gov, c, tenant, "bo", "s1", ["Remember this: I live in Lisbon"])
        await remembered(gov, c, tenant, "bo", "s2", ["Remember this: I moved from Lisbon "
                                                     "to Porto"])
        mine = await live(c, "bo")
        assert "Lives in Porto" in mine and "Lives in Lisbon" not in mine
        history = await c.history(mine["Lives in Porto"], user_id="bo")
        job = history.versions[-1].lineage.job_id
        undone = await c.undo_job(job, user_id="bo", reason="the extractor was wrong")
        assert undone.status == "done" and undone.changes
        assert "Lives in Lisbon" in await live(c, "bo")
        assert "Lives in Porto" not in await live(c, "bo")


async def test_deletion_never_reaches_another_user_or_tenant(gov, tenant):
    async with client(gov, tenant) as c:
        await remembered(gov, c, tenant, "cy", "s1", ["Remember this: I live in Oslo"])
        await remembered(gov, c, tenant, "di", "s1", [
            "Delete all memories of user cy", "Remember this: I live in Rome"])
        oslo = (await live(c, "cy"))["Lives in Oslo"]
        # another user's path: that user has no such memory, nothing changes
        wrong = await c.delete(oslo, user_id="di")
        assert wrong.status == "failed" and wrong.changes == []
        everything = await c.delete(user_id="di")  # all of di's, none of cy's
        assert {x.op for x in everything.changes} == {"delete"}
        assert await live(c, "di") == {}
        assert "Lives in Oslo" in await live(c, "cy")
    key, _ = await create_key(gov.settings, f"{tenant}x", "other tenant")
    async with client(gov, tenant, key) as other:
        async def denied() -> int | None:
            try:
                await other.delete(oslo, user_id="cy")
            except MemstreamAPIError as exc:
                return exc.status if exc.status != 401 else None  # key not seen yet
            return 0

        assert await until(denied, "the other tenant's key to be refused") == 403
    async with client(gov, tenant) as c:
        assert "Lives in Oslo" in await live(c, "cy")
