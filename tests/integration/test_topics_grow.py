"""Growing the partition count on the real broker (docs/operations.md, "Growing the
partition count"): `memstream topics grow` refuses while a worker of the set runs; with it
stopped, the durable topics are copied into a new set of another count, a worker on the
new set (on the old worker's data dir: its shards' checkpoints name the old topics, so they
are restored anew) answers every user exactly as before, and goes on writing for them (a
known user's next job starts at seq 1 in the new set: fenced by the store, re-issued)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memstream.client import AsyncMemoryClient
from memstream.dev.process import settings_env
from memstream.memory.store.partitioned import partition_of
from tests.integration.conftest import Harness, free_port, run_conversations, until

pytestmark = pytest.mark.integration
KEY = "k-grow-admin-0123456789abcdef012345"
FIRST = {"alice": [["I live in Berlin", "we have 2 kids"]],
         "bob": [["I live in Lisbon", "I am allergic to penicillin"]],
         "carol": [["I use mocks in my tests", "I work at Acme as a developer"]],
         "dave": [["I live in Oslo"]]}
LATER = {"alice": [["Big news: we moved from Berlin to Munich.", "so we have 3 kids now"]],
         "erin": [["I live in Rome"]]}


def grow(h: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(h.settings)}
    return subprocess.run([sys.executable, "-m", "memstream.cli", "topics", "grow", *args],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


async def memories(port: int, tenant: str, users) -> dict[str, list[str]]:
    async with AsyncMemoryClient(f"http://127.0.0.1:{port}", KEY, tenant_id=tenant) as client:
        return {u: sorted(m.content for m in await client.get_all(user_id=u)) for u in users}


async def test_a_new_topic_set_of_another_count_answers_every_user_as_before(
        kafka_bootstrap, tmp_path):
    port_a, port_b = free_port(), free_port()
    # workers leave their groups when stopped (the procedure's step 2): no session to wait
    common = {"extract_enabled": True, "jobs_enabled": False, "web_enabled": True,
              "admin_key": KEY, "partitions": 2, "leave_group_on_stop": True,
              "session_timeout_s": 6.0}
    old = await Harness(kafka_bootstrap, tmp_path, web_port=port_a, **common).start()
    new = None
    try:
        old.worker()
        await run_conversations(old, FIRST, "acme")
        before = await memories(port_a, "acme", FIRST)
        assert before["alice"] == ["Has 2 children", "Lives in Berlin"]
        prefix = f"{old.settings.topic_prefix}-g"
        # the count moves most users to another partition (else the test proves little)
        assert any(partition_of("acme", u, 2) != partition_of("acme", u, 5)
                   for u in [*FIRST, *LATER])

        refused = grow(old, "--prefix", prefix, "--partitions", "5")
        assert refused.returncode == 78 and "still run" in refused.stderr, refused.stderr
        (worker,) = old.workers
        worker.stop()  # SIGTERM: shards closed with checkpoints naming the old topics

        grown = grow(old, "--prefix", prefix, "--partitions", "5")
        assert grown.returncode == 0, grown.stdout + grown.stderr
        changes = old.topics.memory_changes.name.replace(old.settings.topic_prefix, prefix)
        (line,) = [ln for ln in grown.stdout.splitlines() if ln.startswith(changes + " ")]
        assert int(line.split()[1]) > 0
        again = grow(old, "--prefix", prefix, "--partitions", "5")  # never copied twice
        assert again.returncode == 78 and "already holds" in again.stderr, again.stderr

        new = await Harness(kafka_bootstrap, tmp_path, web_port=port_b, **{
            **common, "partitions": 5, "topic_prefix": prefix, "app_id": prefix,
            "data_dir": old.settings.data_dir}).start()
        new.worker()

        async def served():
            found = await memories(port_b, "acme", FIRST)
            return found if found == before else None

        assert await until(served, "the new set to answer as the old", timeout=120) == before
        await run_conversations(new, LATER, "acme")
        after = await memories(port_b, "acme", LATER)
        assert after == {"alice": ["Has 3 children", "Lives in Munich"],
                         "erin": ["Lives in Rome"]}
    finally:
        if new is not None:
            await new.close()
        await old.close()
