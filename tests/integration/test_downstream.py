"""A downstream service on the public memory events, end to end (issue 20): the example
SQLite profile projection (``examples/profile_projection.py``) runs as its own process on
``memstream.consumer`` against a worker that seals content (master key). The worker is
SIGKILLed while it applies, the projection is SIGKILLed while it reads; once both caught
up, the projection holds exactly what the API answers for every user, no change applied
twice, and a forget-me removes the user from it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import pytest_asyncio

from memstream.client import AsyncMemoryClient
from memstream.consumer import MemoryChanges
from memstream.contract.events import MemoryEvent
from memstream.core.kafka_io import TopicReader
from memstream.dev.process import settings_env
from tests.integration.conftest import (
    covered_messages,
    end,
    free_port,
    running,
    turns,
    until,
    wait_covered,
)

pytestmark = pytest.mark.integration
ADMIN = "admin-key-downstream-0123456789abcdef"
PORT = free_port()
ROOT = Path(__file__).resolve().parents[2]
USERS = {  # user: sessions of user turns; facts the rule extractor keeps, updates, a delete
    "ana": [["I live in Berlin", "I work at Acme as a developer"],
            ["Big news: we moved from Berlin to Munich.", "I am allergic to penicillin"]],
    "ben": [["I use mocks in my tests", "we have 2 kids"],
            ["I no longer use mocks in my tests, I use real services in containers.",
             "so we have 3 kids now"]],
    "cai": [["Remember this: I live in Lisbon", "I work at Globex as a designer"]],
    "dan": [["I live in Oslo", "I am allergic to peanuts"],
            ["Big news: we moved from Oslo to Bergen.", "we have 1 kid"]],
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ds(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("downstream"),
                       extract_enabled=True, web_enabled=True, web_port=PORT, admin_key=ADMIN,
                       master_key="a master key for the downstream test") as h:
        probe = AsyncMemoryClient(f"http://127.0.0.1:{PORT}", ADMIN, tenant_id="probe")
        await until(lambda: probe.tools(), "the API to answer", timeout=120)
        await probe.aclose()
        yield h


class Service:
    """The example projection as a process of its own (SIGKILL-able)."""

    def __init__(self, h, db: Path, log: Path) -> None:
        self.env = {**os.environ, **settings_env(h.settings), "PYTHONPATH": str(ROOT)}
        self.db, self.log, self.proc = db, log, None

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "profile_projection.py"),
             "--db", str(self.db), "--group", "profiles"],
            env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def rows(self, sql: str, *args: object) -> list[tuple]:
        if not self.db.exists():
            return []
        with sqlite3.connect(self.db) as db:
            try:
                return db.execute(sql, args).fetchall()
            except sqlite3.OperationalError:  # not created yet
                return []

    def applied(self) -> list[str]:
        return [r[0] for r in self.rows("SELECT change_id FROM applied")]

    def profile(self, tenant: str, user: str) -> list[tuple[str, int, str]]:
        return [(r[0], int(r[1]), r[2]) for r in self.rows(
            "SELECT memory_id, version, content FROM memories WHERE tenant = ? AND user = ? "
            "AND status = 'active' ORDER BY memory_id", tenant, user)]


async def events_of(h, tenant: str) -> list[MemoryEvent]:
    reader = await TopicReader(h.settings, h.topics.memory_events.name).start()
    await reader.settle(1.5)
    await reader.stop()
    found = [MemoryEvent.model_validate_json(r.value) for r in reader.records]
    return [e for e in found if e.tenant_id == tenant]


async def test_the_projection_equals_the_api_after_kills_and_honours_forget_me(
        ds, tenant, tmp_path):
    service = Service(ds, tmp_path / "profiles.sqlite", tmp_path / "projection.log")
    try:
        await _run(ds, tenant, service)
    finally:
        service.kill()  # never left running after a failure


async def _run(ds, tenant: str, service: Service) -> None:
    service.start()
    expected: dict[tuple[str, str], int] = {}
    worker = ds.workers[0]
    for i in range(2):  # two rounds of sessions; the worker is killed after the first
        for user, sessions in USERS.items():
            if i < len(sessions):
                msgs = turns(user, f"{user}-s{i}", sessions[i], tenant)
                await ds.send(*msgs, end(session=f"{user}-s{i}", user=user, tenant=tenant))
                expected[(user, f"{user}-s{i}")] = len(msgs)
        if i == 0:  # a job or more applied, the rest in flight: SIGKILL both
            await ds.results.wait_for(
                lambda rs: any(covered_messages(rs, tenant).values()), 120)
            await until(_async(lambda: service.applied() or None), "a first change read", 60)
            service.kill()  # just after it applied: its Kafka commit (every 1 s) not yet
            await asyncio.to_thread(worker.restart, kill=True)
            service.start()
    await wait_covered(ds, expected, timeout=120, tenant=tenant)

    on_topic = await events_of(ds, tenant)
    ids = {e.change_id for e in on_topic}
    assert len(ids) >= 8 and all(e.sealed for e in on_topic if e.op != "erase")

    async def caught_up() -> bool | None:
        return True if ids <= set(service.applied()) else None

    await until(caught_up, "the projection to apply every change", 60)
    client = AsyncMemoryClient(f"http://127.0.0.1:{PORT}", ADMIN, tenant_id=tenant)
    async with client:
        for user in USERS:
            api = sorted((m.memory_id, m.version, m.content)
                         for m in await client.get_all(user_id=user))
            assert api and service.profile(tenant, user) == api, user
        counts = Counter(service.applied())
        assert [c for c, n in counts.items() if n > 1] == []  # 0 duplicates applied
        delivered = Counter(r[0] for r in service.rows("SELECT change_id FROM delivered"))
        assert [c for c, n in delivered.items() if n > 1] == []  # nor delivered twice
        assert {r[0] for r in service.rows("SELECT DISTINCT content FROM delivered")} == {
            "opened"}  # every sealed event opened with the master key
        republished = len(on_topic) - len(ids)
        print(f"downstream: {len(ids)} changes, {republished} republished on the topic, "
              f"{sum(counts.values())} applied once each")

        await client.forget(user_id="ana", reason="downstream test")

        async def gone() -> bool | None:
            erased = service.rows("SELECT user FROM erased WHERE tenant = ?", tenant)
            return True if erased == [("ana",)] and not service.profile(tenant, "ana") else None

        await until(gone, "the projection to drop the forgotten user", 60)
        assert await client.get_all(user_id="ana") == []
        assert service.profile(tenant, "cai") == sorted(
            (m.memory_id, m.version, m.content) for m in await client.get_all(user_id="cai"))
    service.kill()

    # a new consumer reading from the beginning: ana's content no longer opens
    async with MemoryChanges(ds.settings, group_id=None, tenant=tenant, user="ana",
                             idle_timeout_s=3.0) as found:
        seen = [e async for e in found]
    assert {e.content for e in seen if e.op != "erase"} == {"shredded"}
    assert [e.op for e in seen][-1] == "erase"


def _async(probe):
    async def run():
        return probe()
    return run
