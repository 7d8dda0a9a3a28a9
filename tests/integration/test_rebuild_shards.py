"""``memstream rebuild`` on the partitioned store (the default), on the real broker: refused
while a worker holds its shards; with the worker stopped, every partition's shard rebuilt
from the topics verifies equal to the live one and the rebuilt copies are deleted; a shard
that differs is reported and never swapped in; ``--swap`` puts the rebuilt shards in place
with checkpoints, and the restarted worker serves them and goes on writing. A worker whose
shards are gone (a new disk) restores each in a builder process of its own and serves the
same memories."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from memstream.client import AsyncMemoryClient
from memstream.dev.process import settings_env
from memstream.memory.store import Scope, checksum
from memstream.memory.store.edge import EdgeStore
from memstream.memory.store.partitioned import SHARDS_DIR, partition_of
from memstream.streams.shard_builders import ShardBuilders
from tests.integration.conftest import free_port, run_conversations, running, until

pytestmark = pytest.mark.integration
KEY = "k-shards-admin-0123456789abcdef0123"
PORT = free_port()
FIRST = {"alice": [["I live in Berlin", "we have 2 kids"],
                   ["Big news: we moved from Berlin to Munich.", "so we have 3 kids now"]],
         "bob": [["I live in Lisbon", "I am allergic to penicillin"]],
         "carol": [["I use mocks in my tests", "I work at Acme as a developer"]]}
LATER = {"dave": [["I live in Oslo", "we have 2 kids"]]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("shards"),
                       extract_enabled=True, jobs_enabled=False, web_enabled=True,
                       web_port=PORT, admin_key=KEY) as h:
        yield h


def rebuild(h, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(h.settings)}
    return subprocess.run([sys.executable, "-m", "memstream.cli", "rebuild", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


async def memories(tenant: str, users) -> dict[str, list[str]]:
    async with AsyncMemoryClient(f"http://127.0.0.1:{PORT}", KEY, tenant_id=tenant) as client:
        return {u: sorted(m.content for m in await client.get_all(user_id=u)) for u in users}


async def test_shards_are_rebuilt_verified_and_adopted(live, tenant):
    h = live
    assert h.settings.store_partitioned  # the default
    await run_conversations(h, FIRST, tenant)
    before = await memories(tenant, FIRST)
    assert before["alice"] == ["Has 3 children", "Lives in Munich"]

    running_now = rebuild(h)
    assert running_now.returncode != 0 and "open in a running worker" in running_now.stderr

    (worker,) = h.workers
    worker.stop()  # SIGTERM: the shards closed with their checkpoints
    stores = h.settings.data_dir / "stores"
    verified = rebuild(h)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.count("users equal") == h.settings.partitions - sum(
        "no live shard" in line for line in verified.stdout.splitlines())
    assert "verified only" in verified.stdout
    # the shards built side by side, a process per core up to one per partition
    builders = min(len(os.sched_getaffinity(0)), 8, h.settings.partitions)
    assert f"{builders} processes)" in verified.stdout, verified.stdout
    assert not stores.exists() or not any(stores.iterdir())  # no copy left behind

    # one record changed in alice's live shard: reported, not swapped in, exit 1
    root = h.settings.data_dir / SHARDS_DIR
    shard_path = root / str(partition_of(tenant, "alice", h.settings.partitions))
    shard = EdgeStore(shard_path, 512)
    try:
        (memory, *_) = shard.list(Scope(tenant, "alice"))
        shard.write([replace(memory, content="Lives in Paris")], [None])
    finally:
        shard.close()
    differ = rebuild(h, "--swap")
    assert differ.returncode == 1 and "differ" in differ.stdout, differ.stdout + differ.stderr
    assert "nothing swapped" in differ.stdout
    assert not stores.exists() or not any(stores.iterdir())

    swapped = rebuild(h, "--swap", "--force")
    assert swapped.returncode == 1 and "swapped: " in swapped.stdout, swapped.stdout
    for n in range(h.settings.partitions):
        assert (root / f"{n}.checkpoint.json").exists()
    worker.start()

    async def served():
        found = await memories(tenant, FIRST)
        return found if found == before else None

    assert await until(served, "the adopted shards to serve", timeout=90) == before
    await run_conversations(h, LATER, tenant)  # the worker goes on writing into them
    assert (await memories(tenant, LATER))["dave"] == ["Has 2 children", "Lives in Oslo"]

    # the shards gone (a new disk): each restored in full by a builder process, then caught
    # up and served by the worker
    everything = await memories(tenant, {**FIRST, **LATER})
    worker.stop()
    shutil.rmtree(root)
    worker.settings = worker.settings.model_copy(update={"restore_in_process_below": 0,
                                                         "rebuild_processes": 2})
    worker.start()

    async def restored():
        found = await memories(tenant, {**FIRST, **LATER})
        return found if found == everything else None

    assert await until(restored, "the restored shards to serve", timeout=90) == everything
    # each partition restored once: by a builder process when the take restores it, or,
    # when the standby warming it for the hand-over got to it first, in the worker. The
    # users may all live in one partition, served before the other's restore ends: wait
    # for every partition's line.
    def restores() -> list[int]:
        text = worker.log_text()
        built = re.findall(r"\] shard (\d+): \d+ change\(s\) folded in a builder process",
                           text)
        warmed = re.findall(r"\] standby shard (\d+): restored", text)
        return sorted(map(int, built + warmed))

    async def every_partition_restored():
        found = restores()
        return found if set(found) == set(range(h.settings.partitions)) else None

    await until(every_partition_restored, "every partition restored", timeout=90)
    assert restores() == list(range(h.settings.partitions))

    # the worker's builders themselves, side by side (both partitions at once): each shard
    # built whole in its staging directory, moved into place, equal to the worker's own
    worker.stop()
    into = Path(tempfile.mkdtemp())
    builders = ShardBuilders(h.settings, 512, 2)
    done = await asyncio.gather(*(builders.build(n, into) for n in range(h.settings.partitions)))
    assert [d.path for d in done] == [into / str(n) for n in range(h.settings.partitions)]
    assert sorted(p.name for p in into.iterdir()) == [str(n) for n in range(h.settings.partitions)]
    for d in done:
        ours, theirs = EdgeStore(d.path, 512), EdgeStore(root / str(d.partition), 512)
        try:
            verdict = checksum.compare(checksum.digests(theirs.scan(vectors=True)),
                                       checksum.digests(ours.scan(vectors=True)))
        finally:
            ours.close()
            theirs.close()
        assert verdict.ok, verdict.summary()
    shutil.rmtree(into)
