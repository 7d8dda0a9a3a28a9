"""Forget-me end to end with canaries (SPEC §7), on a real broker: a worker with a master
key (change events sealed per user), short content retention and a short erasure bound
(small segments, fast compaction: the broker's retention check runs every 5 s).

A user states a canary; it reaches the store and, sealed, the memory-change topic. After
the forget-me: no read returns the user's memories at once; the store holds nothing of
theirs; a rebuild from the topics holds nothing of theirs; and ``forget verify`` finds 0
residues in the store and every topic after the bound, while another user is untouched.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import pytest_asyncio

from memstream.client import AsyncMemoryClient
from memstream.core.kafka_io import TopicReader
from memstream.memory.crypto.user_keys import UserKeys
from memstream.memory.store import Scope
from memstream.memory.store.rebuild_fold import rebuild
from memstream.memory.store.server import ServerStore
from memstream.ops.forget_verify import verify
from memstream.topics.schemas import MemoryChange
from tests.integration.conftest import free_port, remembered, running, until

pytestmark = pytest.mark.integration
ADMIN = "admin-key-forget-0123456789abcdef012"
PORT = free_port()
BOUND_S = 6.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fm(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("forget"),
                       extract_enabled=True, web_enabled=True, web_port=PORT, admin_key=ADMIN,
                       master_key="a master key for the forget-me test",
                       content_retention_s=4.0, erasure_bound_s=BOUND_S) as h:
        probe = AsyncMemoryClient(f"http://127.0.0.1:{PORT}", ADMIN, tenant_id="probe")
        await until(lambda: probe.tools(), "the API to answer", timeout=120)
        await probe.aclose()
        yield h


def client(h, tenant: str) -> AsyncMemoryClient:
    return AsyncMemoryClient(f"http://127.0.0.1:{PORT}", ADMIN, tenant_id=tenant,
                             bootstrap_servers=h.settings.bootstrap_servers,
                             topic_prefix=h.settings.topic_prefix)


async def changes_of(h, tenant: str) -> list[MemoryChange]:
    reader = await TopicReader(h.settings,
                               h.topics.memory_changes.name).start()
    await reader.settle(1.5)
    await reader.stop()
    found = [MemoryChange.model_validate_json(r.value) for r in reader.records]
    return [c for c in found if c.tenant_id == tenant]


async def rebuilt(h, tenant: str, user: str) -> tuple[list[str], int]:
    from qdrant_client import QdrantClient

    keys = UserKeys(h.settings, h.topics.user_keys.name)
    await keys.start(write=False)
    store = ServerStore("rebuild", 512, client=QdrantClient(":memory:"))
    try:
        assert await keys.wait_ready(30)
        assert keys.rejected == 0  # every key record and marker the worker wrote verifies
        done = rebuild(store, await changes_of(h, tenant), opener=keys.opener())
        return [m.content for m in store.list(Scope(tenant, user))], done.unreadable
    finally:
        store.close()
        await keys.stop()


async def test_forget_me_erases_the_users_content_everywhere(fm, tenant):
    canary = f"Zorgville{uuid.uuid4().hex[:8]}"
    async with client(fm, tenant) as c:
        await remembered(fm, c, tenant, "eve", "s1", [f"Remember this: I live in {canary}",
                                                      "I am allergic to penicillin"])
        await remembered(fm, c, tenant, "sam", "s1", ["Remember this: I live in Oslo"])
        assert f"Lives in {canary}" in {m.content for m in await c.get_all(user_id="eve")}
        sealed = [x for x in await changes_of(fm, tenant) if x.user_id == "eve"]
        assert sealed and all(x.sealed for x in sealed)  # the topic holds no plaintext
        assert not any(canary in x.model_dump_json() for x in sealed)
        assert f"Lives in {canary}" in (await rebuilt(fm, tenant, "eve"))[0]

        result = await c.forget(user_id="eve", reason="user request #4711")
        assert result.status == "done"
        assert [(x.op, x.memory_id) for x in result.changes] == [("erase", "*")]
        assert await c.get_all(user_id="eve") == []
        assert (await c.search("where do I live?", user_id="eve")).memories == []
        assert {m.content for m in await c.get_all(user_id="sam")} == {"Lives in Oslo"}

    contents, unreadable = await rebuilt(fm, tenant, "eve")
    assert contents == [] and unreadable >= 2
    audit = [x for x in await changes_of(fm, tenant) if x.op == "erase"]
    assert [(a.user_id, a.lineage.kind, a.reason) for a in audit] == [
        ("eve", "forget", "forget-me")]  # the request's words may be content: not here
    assert audit[0].after == {"version_records": 2}

    settings = fm.settings.model_copy(update={"web_port": PORT})
    t0 = time.monotonic()

    found = None
    while time.monotonic() - t0 < 240:  # barrier: the verification itself, polled
        found = await asyncio.to_thread(verify, settings, tenant, "eve", [canary])
        if found.total == 0 and found.store_records == 0:
            break
        await asyncio.sleep(2.0)
    assert found is not None and found.total == 0 and found.store_records == 0, found.rows()
    print(f"forget-me: 0 residues after {time.monotonic() - t0:.0f}s "
          f"({found.scanned} records scanned)")
    other = await asyncio.to_thread(verify, settings, tenant, "sam", ["Oslo"])
    assert other.store_records and other.readable_changes  # the other user is untouched
