"""``memstream rebuild`` against a running worker on the real broker: the rebuilt store
equals the live one user by user; ``--swap`` switches the worker to it without a restart
(the worker keeps writing there: a later verify is still equal); a rebuilt store that
differs is reported and not switched to; a partial rebuild of one user replaces only that
user's records."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_asyncio

from memstream.dev.process import settings_env
from memstream.memory.store.edge import EdgeStore
from memstream.memory.store.rebuild_topics import Manifest
from memstream.memory.store.switch import current_store_path
from memstream.ops.rebuild import _ask_worker
from tests.integration.conftest import run_conversations, running, until

pytestmark = pytest.mark.integration

FIRST = {"alice": [["I live in Berlin", "we have 2 kids"],
                   ["Big news: we moved from Berlin to Munich.", "so we have 3 kids now"]],
         "carol": [["I use mocks in my tests", "I work at Acme as a developer"]]}
LATER = {"bob": [["I live in Lisbon", "I am allergic to penicillin"]],
         "carol": [["I no longer use mocks in my tests, I use real services."]]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("rebuild"),
                       extract_enabled=True, jobs_enabled=False,
                       store_partitioned=False,  # the single store's live switch (shards:
                       # tests/integration/test_rebuild_shards.py)
                       # the tests wait for the job results of everything they send
                       # (read_committed, run_conversations) before a rebuild: every change
                       # event is committed by then and the worker writes nothing more, so
                       # no user needs the settle margin and every user is compared (a user
                       # left out shows as "N-1/N-1 users equal ... not compared")
                       rebuild_settle_s=0.0) as h:
        yield h


def rebuild(h, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(h.settings)}
    return subprocess.run([sys.executable, "-m", "memstream.cli", "rebuild", *args], env=env,
                          capture_output=True, text=True, timeout=300)


async def test_rebuild_verifies_switches_and_the_worker_goes_on_in_the_new_store(live, tenant):
    await run_conversations(live, FIRST, tenant)
    before = current_store_path(live.settings)
    done = rebuild(live, "--swap")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "changes/s" in done.stdout and "verified: 2/2 users equal" in done.stdout, done.stdout
    assert "switched: the worker now serves the rebuilt store" in done.stdout, done.stdout
    after = current_store_path(live.settings)
    assert after != before and (after / "rebuild.json").exists()
    # the worker writes into the new store now: new facts, then a verify-only rebuild
    await run_conversations(live, LATER, tenant)
    again = rebuild(live)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "verified: 3/3 users equal" in again.stdout, again.stdout
    assert "verified only" in again.stdout, again.stdout
    assert current_store_path(live.settings) == after
    # the old store is deleted once reads on it are over (5 s), an unkept rebuild at once
    assert len(list((live.settings.data_dir / "stores").iterdir())) == 1

    async def old_store_gone():
        return not (live.settings.data_dir / "qdrant").exists() or None

    await until(old_store_gone, "the old store to be deleted", timeout=60)


async def test_a_store_that_differs_is_neither_verified_nor_switched_to(live, tenant):
    """The verification is not a formality: one memory changed in a rebuilt store is a
    mismatch, the worker does not switch to it, and it is deleted before the answer."""
    await run_conversations(live, {"erin": [["I live in Porto", "I play the cello"]]}, tenant)
    into = Path(live.tmp) / "tampered"
    built = rebuild(live, "--no-verify", "--keep", "--into", str(into))
    assert built.returncode == 0, built.stdout + built.stderr
    store = EdgeStore(into, Manifest.load(into).dim)
    try:
        records = [r for r in store.scan(tenant, "erin", vectors=True)
                   if r[1].get("status") == "active"]
        assert records, "erin has no active memory to change"
        pid, payload, vector = records[0]
        store.write_records([(pid, {**payload, "content": "I live on the moon"}, vector)])
    finally:
        store.close()
    before = current_store_path(live.settings)
    answer = await asyncio.to_thread(_ask_worker, live.settings, into, True, False, False)
    assert not answer.ok and not answer.switched, answer.message
    assert "MISMATCH" in answer.message and "1 differ" in answer.message, answer.message
    assert f"{tenant}/erin" in answer.message and "not switched" in answer.message
    assert current_store_path(live.settings) == before
    assert not into.exists()  # not kept: deleted before the answer


async def test_a_partial_rebuild_replaces_one_user(live, tenant):
    await run_conversations(live, {"dora": [["I live in Oslo", "I have a cat named Miso"]]},
                            tenant)
    into = Path(live.tmp) / "partial"
    done = rebuild(live, "--tenant", tenant, "--user", "dora", "--into", str(into), "--swap")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verified: 1/1 users equal" in done.stdout, done.stdout
    assert "1 user(s) replaced" in done.stdout, done.stdout
    bad = rebuild(live, "--user", "dora")
    assert bad.returncode != 0 and "--user needs --tenant" in bad.stderr
