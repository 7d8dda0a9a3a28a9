"""Two workers that trust nothing they did not verify (issue 29), on the real broker.

One module-scoped cluster of two workers (partitioned store, master key version 1):

- a keyless or wrong-tenant request is refused by the worker it reaches, which forwards
  nothing; a client-sent ``X-Memstream-Standby-Read`` is ignored (the owner answers);
- a rogue group member (signed with another secret, its URL a server of the test's) gets no
  partition, is not in the map, and is never sent a request;
- a body at the 1 MiB limit sent chunked to the worker that does not own the user arrives
  whole; a forwarded write whose answer the caller gave up on is applied once on retry;
- ``memstream keys rotate-master`` while the workers run: every memory stays readable on
  workers that then hold only the new master key, every event opens with its tenant's
  read key and not with another tenant's, and a forget-me still shreds.

Barriers only: the cluster map both workers report, group membership, job coverage and
API answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from pydantic import SecretStr

from memstream.consumer.opening import Opener
from memstream.contract.events import MemoryEvent
from memstream.core import kafka
from memstream.core.kafka_io import TopicReader
from memstream.core.settings import Settings
from memstream.dev.process import WorkerProcess
from memstream.memory.store.partitioned import partition_of
from memstream.ops.keys_rotate import read_key, rotate_master
from memstream.ops.status import serves_what_it_owns
from memstream.streams.cluster import Worker, assignor_for
from memstream.streams.cluster_trust import Trust
from memstream.topics.schemas import MemoryChange
from memstream.web.keys_topic import create_key
from tests.integration.conftest import Harness, chat, end, free_port, until, wait_covered

pytestmark = pytest.mark.integration
ADMIN = "admin-key-trust-0123456789abcdef0123"
K1, K2 = "master-one-0123456789abcdef", "master-two-0123456789abcdef"
LIMIT = 1 << 20
USERS = [f"u{i}" for i in range(8)]


@dataclass
class Two:
    h: Harness
    ports: dict[str, int]
    workers: dict[str, WorkerProcess] = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def start(self, name: str, **settings: Any) -> None:
        s = self.h.settings.model_copy(update={
            "data_dir": self.h.tmp / name, "web_port": self.ports[name],
            "group_instance_id": name, **settings})
        old = self.workers.get(name)
        if old is not None:
            old.stop()
            self.h.workers.remove(old)
        self.workers[name] = w = WorkerProcess(s, self.h.tmp / f"{name}.log").start()
        self.h.workers.append(w)

    async def status(self, name: str) -> dict[str, Any]:
        async with aiohttp.ClientSession(headers=auth()) as http, \
                http.get(self.url(name) + "/v1/cluster") as resp:
            assert resp.status == 200, await resp.text()
            return dict(await resp.json())

    async def serving(self) -> dict[str, Any]:
        """Barrier: both workers report the same map of both, every owned shard served."""
        async def both() -> dict[str, Any] | None:
            seen = [await self.status(n) for n in ("wa", "wb")]
            for s in seen:
                if (sorted(s["workers"]) != ["wa", "wb"] or not s["groups_aligned"]
                        or not serves_what_it_owns(s)):
                    return None
            return seen[0] if seen[0]["partitions"] == seen[1]["partitions"] else None
        return await until(both, "both workers serving", timeout=180)

    async def owner(self, tenant: str, user: str) -> str:
        the_map = await self.serving()
        return str(the_map["partitions"][str(partition_of(tenant, user, 4))]["owner"])


def auth(key: str = ADMIN) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def two(kafka_bootstrap: str, tmp_path_factory: Any) -> AsyncIterator[Two]:
    h = await Harness(kafka_bootstrap, tmp_path_factory.mktemp("trust"), partitions=4,
                      extract_enabled=True, web_enabled=True, admin_key=ADMIN,
                      master_key=K1, http_max_body_bytes=LIMIT).start()
    cluster = Two(h, {"wa": free_port(), "wb": free_port()})
    try:
        for name in ("wa", "wb"):
            cluster.start(name)
        for i, user in enumerate(USERS):  # a fact each, in two tenants
            for tenant in ("acme", "other"):
                await h.send(chat(f"Remember this: I live in city {i}", user=user,
                                  session="s1", tenant=tenant), end("s1", user, tenant))
        for tenant in ("acme", "other"):
            await wait_covered(h, {(u, "s1"): 1 for u in USERS}, timeout=120, tenant=tenant)
        await cluster.serving()
        yield cluster
    finally:
        await h.close()


async def a_user_of(two: Two, owner: str, tenant: str = "acme") -> str:
    for user in USERS:
        if await two.owner(tenant, user) == owner:
            return user
    raise AssertionError(f"no user of {owner}")


async def forwarded(two: Two, name: str) -> int:
    return int((await two.status(name))["requests"]["forwarded"])


async def test_a_request_is_authenticated_where_it_arrives(two):
    user = await a_user_of(two, "wb")
    plaintext, _ = await create_key(two.h.settings, "other", "trust test")
    path = f"/v1/tenants/acme/users/{user}/memories"
    async with aiohttp.ClientSession() as http:
        async def tenant_key_works() -> bool | None:
            async with http.get(two.url("wa") + f"/v1/tenants/other/users/{user}/memories",
                                headers=auth(plaintext)) as resp:
                return True if resp.status == 200 else None
        await until(tenant_key_works, "the tenant key on wa")
        before = await forwarded(two, "wa")
        async with http.get(two.url("wa") + path) as resp:
            assert resp.status == 401 and "X-Memstream-Served-By" not in resp.headers
        async with http.get(two.url("wa") + path, headers=auth(plaintext)) as resp:
            assert resp.status == 403  # a key of tenant "other": refused here
        async with http.get(two.url("wa") + path,
                            headers={**auth("msk_0123456789abcdef_" + "x" * 40)}) as resp:
            assert resp.status == 401
        assert await forwarded(two, "wa") == before  # nothing went to wb
        # a client claiming to be a worker asking for a standby read: the owner answers
        spoof = {**auth(), "X-Memstream-Forwarded": "wb", "X-Memstream-Standby-Read": "1"}
        async with http.get(two.url("wa") + path, headers=spoof) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["X-Memstream-Served-By"] == "wb"
            assert "X-Memstream-Standby" not in resp.headers
        assert await forwarded(two, "wa") == before + 1


async def test_a_rogue_member_gets_nothing_and_is_never_asked(two):
    asked: list[str] = []

    async def record(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"memories": []})

    rogue_app = web.Application()
    rogue_app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(rogue_app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    s = two.h.settings
    maps: list[Any] = []
    rogue_assignor = assignor_for(
        Worker("aaa-rogue", f"http://127.0.0.1:{port}"), None, maps.append,
        trust=Trust.of("another-secret-0123456789abcdef-0123", lambda *_: None))
    group = f"{s.app_id}-apply"
    rogue = kafka.consumer(s, two.h.topics.decisions.name, group_id=group,
                           partition_assignment_strategy=(rogue_assignor,),
                           session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
    await rogue.start()
    try:
        admin = kafka.admin(s)
        await admin.start()

        async def joined() -> bool | None:
            responses = await admin.describe_consumer_groups([group])  # one group a call
            members = responses[0].groups[0][5]
            return True if len(members) == 3 and not rogue.assignment() else None
        try:
            await until(joined, "the rogue in the apply group", timeout=90)
        finally:
            await admin.close()
        the_map = await two.serving()
        assert sorted(the_map["workers"]) == ["wa", "wb"]
        assert set(the_map["partitions"][p]["owner"] for p in the_map["partitions"]) <= {
            "wa", "wb"}
        async with aiohttp.ClientSession(headers=auth()) as http:
            for user in USERS:
                for name in ("wa", "wb"):
                    url = two.url(name) + f"/v1/tenants/acme/users/{user}/memories"
                    async with http.get(url) as resp:
                        assert resp.status == 200, await resp.text()
        assert asked == [] and maps == []  # never asked, never handed the map
    finally:
        await rogue.stop()
        await runner.cleanup()
    await two.serving()


async def test_a_chunked_body_at_the_limit_arrives_whole(two):
    user = await a_user_of(two, "wb")
    url = two.url("wa") + f"/v1/tenants/acme/users/{user}/tools/execute"

    def chunked(size: int) -> Any:
        head = b'{"name": "memory_search", "arguments": "{\\"query\\": \\"city\\"}'
        tail = b'"}'

        async def gen() -> AsyncIterator[bytes]:
            yield head
            left = size - len(head) - len(tail)
            while left > 0:
                n = min(left, 16_384)
                yield b" " * n  # whitespace inside the arguments string: still valid JSON
                left -= n
                await asyncio.sleep(0)
            yield tail
        return gen()

    async with aiohttp.ClientSession(headers=auth()) as http:
        async with http.post(url, data=chunked(LIMIT - 1024),
                             headers={"Content-Type": "application/json"}) as resp:
            body = await resp.json()
            assert resp.status == 200 and body["status"] == "ok", body
            assert resp.headers["X-Memstream-Served-By"] == "wb"
        async with http.post(url, data=chunked(LIMIT + 4096),
                             headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 413


async def test_a_forwarded_write_answered_late_is_applied_once(two):
    user = await a_user_of(two, "wb")
    url = two.url("wa") + f"/v1/tenants/acme/users/{user}/tools/execute"
    call = {"name": "memory_insert", "wait_s": 10,
            "arguments": {"content": "The user keeps bees on the roof"}}
    key = {"Idempotency-Key": f"bees-{time.time_ns()}"}
    async with aiohttp.ClientSession(headers=auth()) as http:
        # the caller gives up after 50 ms (whether the answer was on its way or not: the
        # write is applied once either way, which is what is checked)
        with contextlib.suppress(asyncio.TimeoutError):
            async with http.post(url, json=call, headers=key,
                                 timeout=aiohttp.ClientTimeout(total=0.05)):
                pass
        for _ in range(2):  # the client's retries, same key
            async with http.post(url, json=call, headers=key) as resp:
                body = await resp.json()
                assert resp.status == 200 and body["status"] in ("ok", "queued"), body
                assert resp.headers["Idempotency-Key"] == key["Idempotency-Key"]

        async def bees() -> list[str] | None:
            async with http.get(two.url("wb") + f"/v1/tenants/acme/users/{user}/memories"
                                ) as resp:
                found = [m["content"] for m in (await resp.json())["memories"]
                         if "bees" in m["content"]]
            return found or None
        assert len(await until(bees, "the bees memory")) == 1
    reader = await TopicReader(two.h.settings, two.h.topics.memory_changes.name).start()
    try:
        await reader.settle(2.0)
        changes = [MemoryChange.model_validate_json(r.value) for r in reader.records
                   if r.key == f"acme/{user}".encode()]
    finally:
        await reader.stop()
    tools = {c.change_id for c in changes if c.lineage.kind == "tool" and c.op == "add"}
    assert len(tools) == 1, tools  # one change, whatever the retries (a republished copy
    # of it comes again under the same change id)


async def test_rotate_master_while_the_workers_run(two):
    h = two.h
    acme_read, _ = await read_key(h.settings, "acme")
    v2 = {"master_key": SecretStr(K2), "master_key_version": 2}
    for name in ("wa", "wb"):  # rolling: the new version, the old one still accepted
        two.start(name, **v2, master_key_previous=SecretStr(f"1:{K1}"))
        await two.serving()
    rotating = h.settings.model_copy(update={**v2, "master_key_previous": SecretStr(f"1:{K1}")})
    report = await rotate_master(rotating)
    assert report.complete and report.keks >= 2, report
    for name in ("wa", "wb"):  # the old version dropped
        two.start(name, **v2)
        await two.serving()
    async with aiohttp.ClientSession(headers=auth()) as http:
        for tenant in ("acme", "other"):
            for i, user in enumerate(USERS):
                url = two.url("wa") + f"/v1/tenants/{tenant}/users/{user}/memories"
                async with http.get(url) as resp:
                    got = [m["content"] for m in (await resp.json())["memories"]]
                assert any(f"city {i}" in m.lower() for m in got), (tenant, user, got)
    opened = await open_events(h.settings, acme_read)
    assert {c for t, c in opened if t == "acme"} == {"opened"}
    assert {c for t, c in opened if t == "other"} == {"sealed"}
    # a forget-me after the rotation still shreds
    async with aiohttp.ClientSession(headers=auth()) as http:
        url = two.url("wa") + "/v1/tenants/acme/users/u0/forget"
        async with http.post(url, json={"reason": "trust test"}) as resp:
            assert resp.status == 200, await resp.text()
    shredded = await open_events(h.settings, acme_read, user="u0")
    assert {c for t, c in shredded if t == "acme"} == {"shredded"}
    assert {c for t, c in shredded if t == "other"} == {"sealed"}  # other's u0: not acme's


async def open_events(settings: Settings, read_key_: str,
                      user: str | None = None) -> list[tuple[str, str]]:
    """(tenant, what became of the content) of every public event (of ``user``), opened by
    a reader holding ``read_key_`` only."""
    reader_settings = settings.model_copy(update={
        "master_key": None, "master_key_previous": None, "read_keys": SecretStr(read_key_)})
    opener = Opener(reader_settings, settings.topic("user-keys"), require_content=False)
    await opener.start()
    reader = await TopicReader(settings, settings.topic("memory-events")).start()
    try:
        await reader.settle(2.0)
        out = []
        for r in reader.records:
            event = MemoryEvent.model_validate_json(r.value)
            if (user is not None and event.user_id != user) or event.op == "erase":
                continue
            _, content = await opener.open(event)
            out.append((event.tenant_id, content))
        return out
    finally:
        await reader.stop()
        await opener.stop()
