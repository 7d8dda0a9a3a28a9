"""The ingest stage end to end on a real broker: messages in, extraction jobs out."""

from __future__ import annotations

import base64
import json
from functools import partial

import pytest
import pytest_asyncio

from memstream.topics.schemas import DeadLetter, JobStatus, TriggerReason
from tests.integration.conftest import chat, end, running

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(scope="module")
async def shared(kafka_bootstrap, tmp_path_factory):
    """One ingest-only worker for the module (the tests play the extractor); each test
    works on a tenant of its own and reads only that tenant's jobs."""
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("ingest"),
                       max_content_chars=1000) as h:
        yield h


class Tenant:
    """The shared harness seen from one test's tenant."""

    def __init__(self, h, tenant):
        self.h, self.tenant = h, tenant
        self.chat = partial(chat, tenant=tenant)
        self.end = partial(end, tenant=tenant)
        self.send, self.complete, self.send_raw = h.send, h.complete, h.send_raw

    async def wait_jobs(self, n, timeout=30.0):
        return await self.h.wait_jobs(n, timeout, tenant=self.tenant)

    def job_list(self):
        return self.h.job_list(self.tenant)

    async def settle(self, quiet):
        await self.h.jobs.settle(quiet)


@pytest.fixture
def t(shared, tenant):
    return Tenant(shared, tenant)

FACTS = ["I live in Berlin", "I have two kids", "I work at Siemens", "I am vegetarian",
         "My budget is 50k this month", "I prefer short answers", "I drive a Volvo",
         "My wife is called Anna"]


def ranges(jobs):
    return [(j.session_id, j.from_seq, j.to_seq, j.reason) for j in jobs]


async def test_threshold(t):
    await t.send(*[t.chat(f) for f in FACTS[:3]])
    await t.settle(2.0)
    assert t.job_list() == []
    await t.send(t.chat(FACTS[3]))
    jobs = await t.wait_jobs(1)
    assert ranges(jobs) == [("s1", 0, 4, TriggerReason.THRESHOLD)]
    assert [m.content for m in jobs[0].messages] == FACTS[:4]


async def test_coalescing_under_burst(t):
    await t.send(*[t.chat(f) for f in FACTS[:4]])
    first = (await t.wait_jobs(1))[0]
    await t.send(*[t.chat(f"burst fact number {i}") for i in range(30)])
    await t.settle(2.0)
    assert len(t.job_list()) == 1  # one job in flight: the burst only sets dirty
    await t.complete(first)
    jobs = await t.wait_jobs(2)
    await t.settle(1.5)
    assert ranges(t.job_list())[1:] == [("s1", 4, 34, TriggerReason.THRESHOLD)]
    assert len(jobs[1].messages) == 30 and [m.seq for m in jobs[1].context] == [0, 1, 2, 3]


async def test_explicit_trigger_below_threshold(t):
    await t.send(t.chat("hello, I'm planning a trip"), t.chat("记住：我对花生过敏"))
    jobs = await t.wait_jobs(1)
    assert ranges(jobs) == [("s1", 0, 2, TriggerReason.EXPLICIT)]


async def test_session_end_flushes(t):
    await t.send(t.chat(FACTS[0]), t.chat(FACTS[1]))
    # barrier: the end is on another topic, so it may be read before the turns it follows
    # (it then flushes what was read: coalescing.on_session_end); here it comes after them
    await t.h.ingest_caught_up()
    await t.send(t.end())
    jobs = await t.wait_jobs(1)
    assert ranges(jobs) == [("s1", 0, 2, TriggerReason.SESSION_END)]


async def test_three_interleaved_sessions_of_one_user(t):
    for i in range(4):
        await t.send(*[t.chat(f"{s} fact {i}", session=s) for s in ("A", "B", "C")])
    seen = []
    for n in range(1, 4):
        jobs = await t.wait_jobs(n)
        await t.settle(1.0)
        assert len(t.job_list()) == n, "a second job was emitted while one was in flight"
        seen.append(jobs[-1])
        await t.complete(jobs[-1])
    assert sorted((j.session_id, j.from_seq, j.to_seq) for j in seen) == [
        ("A", 0, 4), ("B", 0, 4), ("C", 0, 4)]
    await t.settle(1.5)
    assert len(t.job_list()) == 3


async def test_duplicate_message_ids_count_once(t):
    dup = t.chat(FACTS[0], mid="same-id")
    await t.send(dup, dup, dup, t.chat(FACTS[1]), t.chat(FACTS[2]))
    await t.settle(2.0)
    assert t.job_list() == []  # 3 distinct messages: below the threshold
    await t.send(dup, t.chat(FACTS[3]))
    jobs = await t.wait_jobs(1)
    assert next(m.message_id for m in jobs[0].messages) == "same-id"
    assert len({m.message_id for m in jobs[0].messages}) == 4 == jobs[0].to_seq


async def test_all_trivial_job_costs_no_extraction(t):
    await t.send(t.chat("ok"), t.chat("👍", role="assistant"), t.chat("谢谢"), t.chat("继续"))
    await t.h.results.wait_for(lambda rs: len(t.h.result_list(t.tenant)) >= 1)
    res = t.h.result_list(t.tenant)[0]
    assert res.status == JobStatus.TRIVIAL and (res.from_seq, res.to_seq) == (0, 4)
    await t.settle(1.5)
    assert t.job_list() == []


async def test_an_assistant_turn_after_trivial_user_turns_goes_as_a_job_to_be_archived(t):
    """The episodic archive keeps a real assistant turn (docs/archive.md): its range is not
    closed inline; the job is decided without an LLM call (all its user turns are
    trivial), here by the test."""
    await t.send(t.chat("ok"), t.chat("Sure, anything else?", role="assistant"), t.chat("谢谢"),
                 t.chat("继续"))
    await t.h.jobs.wait_for(lambda rs: len(t.job_list()) >= 1)
    (job,) = t.job_list()
    assert (job.from_seq, job.to_seq) == (0, 4) and t.h.result_list(t.tenant) == []


async def test_bad_input_goes_to_dead_letters_and_nothing_valid_is_lost(t):
    good = t.chat(FACTS[0]).model_dump(mode="json")
    key = f"{t.tenant}/u1".encode()
    bad = [
        (b"{not json", key, "not_json"),
        (json.dumps({**good, "role": 5}).encode(), key, "schema"),
        (json.dumps({k: v for k, v in good.items() if k != "user_id"}).encode(),
         key, "schema"),
        (json.dumps({**good, "schema_version": 99}).encode(), key, "version"),
        (json.dumps({**good, "content": ""}).encode(), key, "empty"),
        (json.dumps({**good, "content": "x" * 5000}).encode(), key, "too_large"),
        (json.dumps({**good, "user_id": "../../etc"}).encode(),
         f"{t.tenant}/../../etc".encode(), "schema"),
        (json.dumps(good).encode(), f"{t.tenant}/someone-else".encode(), "key"),
    ]
    for i, (value, key, _) in enumerate(bad):
        await t.send_raw(value, key)
        await t.send(t.chat(FACTS[i % 4], mid=f"good-{i}"))
    await t.h.dlq.wait_for(lambda rs: len(rs) >= len(bad))
    letters = [DeadLetter.model_validate_json(r.value) for r in t.h.dlq.records]
    by_value = {base64.b64decode(d.value_b64): d for d in letters}
    for value, _, kind in bad:
        assert by_value[value].kind == kind and by_value[value].reason
    jobs = await t.wait_jobs(1)
    assert [m.message_id for m in jobs[0].messages] == [f"good-{i}" for i in range(4)]


async def test_users_do_not_share_state(t):
    await t.send(*[t.chat(f, user="alice") for f in FACTS[:3]])
    await t.send(*[t.chat(f, user="bob") for f in FACTS[:3]])
    await t.settle(2.0)
    assert t.job_list() == []
    await t.send(t.chat(FACTS[3], user="bob"))
    jobs = await t.wait_jobs(1)
    assert [(j.user_id, j.to_seq) for j in jobs] == [("bob", 4)]


async def test_idle_timeout_flushes(harness):
    h = await harness(idle_timeout_s=2.0)
    h.worker()
    await h.send(chat(FACTS[0]))
    await h.jobs.settle(1.0)
    assert h.job_list() == []
    jobs = await h.wait_jobs(1, timeout=20)
    assert ranges(jobs) == [("s1", 0, 1, TriggerReason.IDLE)]


@pytest.mark.parametrize("crash", [False, True], ids=["graceful", "sigkill"])
async def test_worker_restart_recovers_state_from_changelog(harness, crash):
    h = await harness()
    w = h.worker()
    await h.send(*[chat(t) for t in FACTS[:4]])
    first = (await h.wait_jobs(1))[0]
    await h.send(*[chat(t) for t in FACTS[4:7]])  # 3 more while the job is in flight
    await h.ingested(7)
    w.stop(kill=crash)
    h.worker()
    await h.send(chat(FACTS[7]))
    await h.complete(first)
    await h.wait_jobs(2, timeout=45)
    await h.jobs.settle(2.0)
    jobs = h.job_list()
    firsts = {j.job_id for j in jobs if j.from_seq == 0}
    assert firsts == {first.job_id}, "job for [0,4) re-emitted under a new id"
    follow = [j for j in jobs if j.from_seq != 0]
    assert {(j.from_seq, j.to_seq) for j in follow} == {(4, 8)}
    assert [m.content for m in follow[0].messages] == FACTS[4:8]
