"""A crashed worker comes back: static membership, its tables restored from their
changelogs, no crash when a rebalance follows a recovery, and only memstream's own HTTP
views (streams/faust_setup.py).

Restart times are measured by ``benchmarks/restart.py``; these tests assert behaviour only.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request

import pytest
from pydantic import SecretStr

from memstream.dev.process import WorkerProcess
from tests.integration.conftest import Harness, chat, free_port

pytestmark = pytest.mark.integration

USERS = [f"user{i}" for i in range(8)]  # keys on both partitions
JOINED = re.compile(r"Joined group '[^']+' \(generation (\d+)\) with member_id (\S+)")


def worker_with_own_dir(h: Harness, name: str, **overrides: object) -> WorkerProcess:
    """Another worker in the same group: its own data dir (its own store and static id)."""
    settings = h.settings.model_copy(update={"data_dir": h.tmp / name, **overrides})
    w = WorkerProcess(settings, h.tmp / f"{name}.log").start()
    h.workers.append(w)
    return w


def log_of(w: WorkerProcess) -> str:
    return w.log_path.read_text(errors="replace")


async def logged(w: WorkerProcess, text: str, times: int = 1, timeout: float = 60.0) -> None:
    """Barrier: ``text`` is in the worker's log ``times`` times."""
    deadline = time.monotonic() + timeout
    while log_of(w).count(text) < times:
        assert time.monotonic() < deadline, f"{text!r} not logged {times}x:\n{log_of(w)[-2000:]}"
        await asyncio.sleep(0.1)


def assert_no_recovery_crash(*workers: WorkerProcess) -> None:
    for w in workers:
        text = log_of(w)
        assert w.proc is not None and w.proc.poll() is None, f"worker exited:\n{text[-3000:]}"
        assert "ConsistencyError" not in text and "Crashed reason" not in text, text[-3000:]


async def three_each(h: Harness, users: list[str], prefix: str) -> None:
    """Three messages per user: below the threshold, so they live only in the table."""
    for i in range(3):
        await h.send(*[chat(f"{prefix} fact {i} of {u}", user=u) for u in users])


async def fourth_each(h: Harness, users: list[str], prefix: str) -> None:
    await h.send(*[chat(f"{prefix} fact 3 of {u}", user=u) for u in users])


def assert_jobs_cover_all_four(h: Harness, users: list[str], prefix: str) -> None:
    """One [0, 4) job per user, carrying the three messages sent before the crash/rebalance:
    the table state survived."""
    jobs = {j.user_id: j for j in h.job_list() if j.user_id in users}
    assert set(jobs) == set(users)
    for u, j in jobs.items():
        assert (j.from_seq, j.to_seq) == (0, 4)
        assert [m.content for m in j.messages] == [f"{prefix} fact {i} of {u}" for i in range(4)]


async def test_sigkilled_worker_rejoins_as_the_same_member_and_restores_its_state(harness):
    h = await harness(session_timeout_s=30.0, heartbeat_interval_s=3.0)
    w = h.worker()
    await three_each(h, USERS, "a")
    await h.ingested(3 * len(USERS))  # in the table's committed changelog
    w.stop(kill=True)
    w2 = h.worker()
    await fourth_each(h, USERS, "a")
    await h.wait_jobs(len(USERS), timeout=30)
    await h.jobs.settle(1.5)
    assert_jobs_cover_all_four(h, USERS, "a")
    assert_no_recovery_crash(w2)
    before, after = JOINED.findall(log_of(w)), JOINED.findall(log_of(w2))
    # Static membership: the broker hands the dead member's partitions to the restarted one
    # without a rebalance (same generation) instead of waiting out the 30 s session.
    assert after[0][0] == before[-1][0]
    assert after[0][1].split("-")[:2] == before[-1][1].split("-")[:2]  # same instance id
    # Recovery ended on the last changelog record, not on Faust's 2x5 s of silence.
    assert "Aborted tx until highwater" not in log_of(w2)


async def test_a_rebalance_after_a_recovery_neither_crashes_nor_loses_state(harness):
    # The reported crash: recovery's offsets survive in memory, the next rebalance read the
    # changelog end from the consumer's cached LSO (None for a paused partition: -1), and
    # Faust raised ConsistencyError "persisted offset ... higher than the last offset".
    h = await harness()
    first = h.worker()
    await three_each(h, USERS[:4], "a")
    await h.ingested(12)
    first.stop(kill=True)
    survivor = h.worker()  # recovers both changelog partitions up to their last record
    await three_each(h, USERS[4:], "b")
    await h.ingested(24)
    newcomer = worker_with_own_dir(h, "second")  # rebalance: each keeps one partition
    await logged(newcomer, "ingest loop: partitions")  # both took their share
    await logged(survivor, "ingest loop: partitions", times=2)
    assert_no_recovery_crash(survivor, newcomer)
    await fourth_each(h, USERS[:4], "a")
    await fourth_each(h, USERS[4:], "b")
    await h.wait_jobs(len(USERS), timeout=30)
    await h.jobs.settle(1.5)
    assert_jobs_cover_all_four(h, USERS[:4], "a")
    assert_jobs_cover_all_four(h, USERS[4:], "b")
    assert_no_recovery_crash(survivor, newcomer)


def status_of(url: str) -> int:
    """The status of GET url; 0 while nothing listens."""
    try:
        return get(url)[0]
    except OSError:
        return 0


def get(url: str, key: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"X-API-Key": key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


ADMIN = "k-9-admin-0123456789abcdef01234567"


async def test_the_worker_serves_only_memstream_views(harness):
    port = free_port()
    h = await harness(extract_enabled=True, embedder="hashing", web_enabled=True,
                      web_port=port, admin_key=SecretStr(ADMIN))
    h.worker()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60  # the API starts once the worker's tables are restored
    while (await asyncio.to_thread(status_of, base + "/v1/health")) != 200:
        assert time.monotonic() < deadline, "the API never became healthy"
        await asyncio.sleep(0.2)
    for path in ["/", "/router/", "/table/", "/table/ingest-state/", "/stats/",
                 "/assignment/", "/graph/", "/performance/"]:
        status, _ = await asyncio.to_thread(get, base + path)
        assert status == 404, path
    ours = base + "/v1/tenants/acme/users/u1/memories"
    assert (await asyncio.to_thread(get, ours))[0] == 401
    status, body = await asyncio.to_thread(get, ours, ADMIN)
    assert status == 200 and json.loads(body)["memories"] == []
