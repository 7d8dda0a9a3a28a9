"""``memstream worker --processes 2`` (issue 49): one supervisor, two children that join the
groups and split the partitions; every user's memories answered through the one front port
(SO_REUSEPORT: whichever child takes the connection forwards to the owner); a SIGKILLed child
restarted by the supervisor with everything converging again; SIGTERM stops them all.

No cluster secret is configured: the children share the supervisor's data dir's secret.
Barriers only: the cluster map the children report, job coverage, API answers, the pids
the supervisor publishes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from memstream.client import AsyncMemoryClient
from memstream.dev.process import WorkerProcess
from memstream.memory.store.partitioned import partition_of
from memstream.ops.supervisor import PIDS_FILE
from tests.integration.conftest import free_port, remembered, until
from tests.integration.test_scale import ADMIN, CITIES, both_serving, memories, two_per_partition

pytestmark = pytest.mark.integration


async def pids(data_dir: Path) -> dict[str, int] | None:
    try:
        return json.loads((data_dir / PIDS_FILE).read_text())["children"]
    except (OSError, ValueError):
        return None


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def front_reads(front: str, tenant: str, users: list[str],
                      expected: dict[str, list[str]], rounds: int = 3) -> bool | None:
    """Every user's memories, as expected, on each of ``rounds`` fresh connections to the
    front port (the kernel hands them to either child)."""
    for _ in range(rounds):
        for u in users:
            if await memories(front, tenant, u) != expected[u]:
                return None
    return True


async def test_two_processes_split_the_partitions_restart_and_stop(harness, tenant):
    front = free_port()
    while True:  # the children's own ports: the two above the front port, free
        if all(free_port() == front + 1 + i for i in range(2)):
            break
        front = free_port()
    h = await harness(extract_enabled=True, web_enabled=True, partitions=4, admin_key=ADMIN,
                      cluster_secret=None)
    data_dir = h.tmp / "procs"
    settings = h.settings.model_copy(update={
        "data_dir": data_dir, "web_port": front, "group_instance_id": "procs",
        "processes": 2})
    sup = WorkerProcess(settings, h.tmp / "procs.log").start(timeout=120)
    h.workers.append(sup)
    own = [f"http://127.0.0.1:{front + 1 + i}" for i in range(2)]
    front_url = f"http://127.0.0.1:{front}"
    the_map: dict[str, Any] = await until(lambda: both_serving(own, 2),
                                          "both children serving", timeout=120)
    assert the_map["workers"] == {"procs-p0": own[0], "procs-p1": own[1]}, the_map
    users = two_per_partition(tenant, 4)
    owner = {u: the_map["partitions"][str(partition_of(tenant, u, 4))]["owner"]
             for u in users}
    assert set(owner.values()) == {"procs-p0", "procs-p1"}, owner  # they split them

    async with AsyncMemoryClient(front_url, ADMIN, tenant_id=tenant,
                                 bootstrap_servers=h.settings.bootstrap_servers,
                                 topic_prefix=h.settings.topic_prefix) as client:
        await asyncio.gather(*(remembered(h, client, tenant, u, "s1",
                                          [f"Remember this: I live in {CITIES[i]}"])
                               for i, u in enumerate(users)))
    expected = {u: [f"Lives in {CITIES[i]}"] for i, u in enumerate(users)}
    await until(lambda: front_reads(front_url, tenant, users, expected),
                "every user's memories through the front port", timeout=90)

    before = await until(lambda: pids(data_dir), "the children's pids")
    victim = "1" if owner[users[0]] == "procs-p1" else "0"
    os.kill(before[victim], signal.SIGKILL)  # a crash: the supervisor restarts it

    async def restarted() -> dict[str, int] | None:
        now = await pids(data_dir)
        return now if now and now[victim] != before[victim] else None

    after = await until(restarted, "the killed child restarted", timeout=60)
    assert after[str(1 - int(victim))] == before[str(1 - int(victim))]  # the other kept on
    await until(lambda: both_serving(own, 2), "both children serving again", timeout=180)
    moved = users[0]
    async with AsyncMemoryClient(front_url, ADMIN, tenant_id=tenant,
                                 bootstrap_servers=h.settings.bootstrap_servers,
                                 topic_prefix=h.settings.topic_prefix) as client:
        await remembered(h, client, tenant, moved, "s2",
                         ["Remember this: I am allergic to penicillin"])
    expected[moved] = sorted([*expected[moved], "Allergic to penicillin"])
    await until(lambda: front_reads(front_url, tenant, users, expected),
                "every memory through the front port after the restart", timeout=90)
    assert "p" + victim + " restarted" in sup.log_text()

    assert sup.stop(timeout=60) == 0  # SIGTERM: every child stopped cleanly
    assert all(gone(pid) for pid in after.values())
    assert await pids(data_dir) is None
