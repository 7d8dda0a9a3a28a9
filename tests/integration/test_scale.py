"""Two workers on the partitioned embedded store (issue 18): every request answered by
either worker, the owner's answer whoever is asked; the owner SIGKILLed → reads keep
answering (a standby, then the new owner), writes resume, nothing is lost.

Barriers only: the cluster map both workers report, job coverage, API answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from memstream.core.cluster_auth import CREDENTIAL_HEADER, forward_credential
from memstream.dev.process import WorkerProcess
from memstream.memory.store.partitioned import partition_of
from memstream.ops.status import serves_what_it_owns
from tests.integration.conftest import free_port, remembered, until

pytestmark = pytest.mark.integration
ADMIN = "admin-key-scale-0123456789abcdef0123"
CLUSTER_SECRET = "cluster-secret-scale-0123456789abcdef0123"  # two workers: required
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
ADMIN_PRINCIPAL = '{"key_id":"admin","tenant_id":null,"admin":true}'


def standby_read(path: str) -> dict[str, str]:
    """What a worker that forwards a read asks of a standby (answered from the local
    standby): signed with the cluster secret, as a worker signs it (a client's
    ``X-Memstream-*`` headers are dropped)."""
    headers = {"X-Memstream-Forwarded": "wb", "X-Memstream-To": "wa",
               "X-Memstream-Principal": ADMIN_PRINCIPAL, "X-Memstream-Standby-Read": "1",
               "Accept": "application/json"}
    headers[CREDENTIAL_HEADER] = forward_credential(
        CLUSTER_SECRET, worker="wb", method="GET", target=path, body=b"", headers=headers,
        now=time.time())
    return headers
CITIES = ["Lisbon", "Porto", "Madrid", "Vienna", "Oslo", "Riga", "Quito", "Lima"]


def start_worker(h: Any, name: str, port: int) -> WorkerProcess:
    settings = h.settings.model_copy(update={
        "data_dir": h.tmp / name, "web_port": port, "group_instance_id": name})
    w = WorkerProcess(settings, h.tmp / f"{name}.log").start()
    h.workers.append(w)
    return w


async def get(url: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=10.0) as c:
        return await c.get(path, headers=headers)


async def memories(url: str, tenant: str, user: str,
                   headers: Callable[[str], dict[str, str]] | None = None) -> list[str] | None:
    """The user's live memories as ``url`` answers (None: not answered now); ``headers``
    made for the path at each call."""
    path = f"/v1/tenants/{tenant}/users/{user}/memories"
    try:
        r = await get(url, path, headers(path) if headers is not None else None)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return sorted(m["content"] for m in r.json()["memories"])


async def both_serving(urls: list[str], workers: int) -> dict[str, Any] | None:
    """Barrier: every worker reports the same map of ``workers`` workers, its groups
    aligned, and every partition it owns served (restored)."""
    seen = []
    for url in urls:
        try:
            r = await get(url, "/v1/cluster")
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        status = r.json()
        if (len(status["workers"]) != workers or not status["groups_aligned"]
                or not serves_what_it_owns(status)):
            return None
        seen.append(status)
    if any(s["partitions"] != seen[0]["partitions"] for s in seen):
        return None
    return seen[0]


def two_per_partition(tenant: str, partitions: int) -> list[str]:
    """The first two users ``u<i>`` of each partition: every worker owns some."""
    found: dict[int, list[str]] = {n: [] for n in range(partitions)}
    i = 0
    while any(len(us) < 2 for us in found.values()):
        user = f"u{i}"
        i += 1
        place = found[partition_of(tenant, user, partitions)]
        if len(place) < 2:
            place.append(user)
    return sorted((u for us in found.values() for u in us), key=lambda u: int(u[1:]))


async def test_two_workers_answer_for_each_other_and_survive_the_owner_dying(
        harness, tenant):
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    h = await harness(extract_enabled=True, web_enabled=True,  # the store: the default
                      partitions=4, admin_key=ADMIN, cluster_secret=CLUSTER_SECRET)
    if True:
        a = start_worker(h, "wa", ports[0])
        b = start_worker(h, "wb", ports[1])
        the_map = await until(lambda: both_serving(urls, 2), "both workers serving",
                              timeout=120)
        users = two_per_partition(tenant, 4)  # (u0..u7 may all live with one worker)
        owner = {u: the_map["partitions"][str(partition_of(tenant, u, 4))]["owner"]
                 for u in users}
        assert set(owner.values()) == {"wa", "wb"}, owner  # both own users
        from memstream.client import AsyncMemoryClient

        async with AsyncMemoryClient(urls[0], ADMIN, tenant_id=tenant,
                                     bootstrap_servers=h.settings.bootstrap_servers,
                                     topic_prefix=h.settings.topic_prefix) as client:
            await asyncio.gather(*(remembered(h, client, tenant, u, "s1",
                                              [f"Remember this: I live in {CITIES[i]}"])
                                   for i, u in enumerate(users)))
        before = {}
        for i, u in enumerate(users):
            via_a = await until(lambda u=u: memories(urls[0], tenant, u), f"{u} via wa")
            via_b = await until(lambda u=u: memories(urls[1], tenant, u), f"{u} via wb")
            assert via_a == via_b == [f"Lives in {CITIES[i]}"], (u, via_a, via_b)
            before[u] = via_a
        r = await get(urls[0], f"/v1/tenants/{tenant}/users/{users[0]}/memories")
        assert r.headers["X-Memstream-Served-By"] == owner[users[0]]

        b_users = [u for u in users if owner[u] == "wb"]
        for u in b_users:  # barrier: wa's standby of wb's partitions holds them too
            assert await until(lambda u=u: memories(urls[0], tenant, u, standby_read),
                               f"{u} on wa's standby", timeout=60) == before[u]
        b.kill()  # SIGKILL: its partitions stay assigned to it until its session times out
        first = await get(urls[0], f"/v1/tenants/{tenant}/users/{b_users[0]}/memories")
        status = (await get(urls[0], "/v1/cluster")).json()
        if status["partitions"][str(partition_of(tenant, b_users[0], 4))]["owner"] == "wb":
            # wb still holds the partition (its session has not timed out): the standby
            # answered, and says so
            assert first.status_code == 200, first.text
            assert first.headers.get("X-Memstream-Standby") == "1", dict(first.headers)
            assert sorted(m["content"] for m in first.json()["memories"]) == before[b_users[0]]
        for u in b_users:  # answered all along: the standby, then the new owner
            assert await until(lambda u=u: memories(urls[0], tenant, u), f"{u} after kill",
                               timeout=60) == before[u]
        await until(lambda: both_serving(urls[:1], 1), "wa owns every partition",
                    timeout=120)
        async with AsyncMemoryClient(urls[0], ADMIN, tenant_id=tenant,
                                     bootstrap_servers=h.settings.bootstrap_servers,
                                     topic_prefix=h.settings.topic_prefix) as client:
            moved = b_users[0]
            await remembered(h, client, tenant, moved, "s2",
                             ["Remember this: I am allergic to penicillin"])
        after = await until(lambda: memories(urls[0], tenant, moved), "the new write")
        assert "Allergic to penicillin" in " ".join(after), after
        for u in users:  # nothing lost (a read that meets a partition being taken gets a 503:
            # the barrier is an answer, not the first attempt)
            got = await until(lambda u=u: memories(urls[0], tenant, u), f"{u} at the end",
                              timeout=60)
            assert set(before[u]) <= set(got), (u, got)
        assert a.alive()
