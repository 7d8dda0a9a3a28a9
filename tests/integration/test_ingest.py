"""The ingest stage end to end on a real broker: messages in, extraction jobs out."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from memstream.topics.schemas import DeadLetter, JobResult, JobStatus, TriggerReason
from tests.integration.conftest import chat, end

pytestmark = pytest.mark.integration

FACTS = ["I live in Berlin", "I have two kids", "I work at Siemens", "I am vegetarian",
         "My budget is 50k this month", "I prefer short answers", "I drive a Volvo",
         "My wife is called Anna"]


def ranges(jobs):
    return [(j.session_id, j.from_seq, j.to_seq, j.reason) for j in jobs]


async def test_threshold(harness):
    h = await harness()
    h.worker()
    await h.send(*[chat(t) for t in FACTS[:3]])
    await h.jobs.settle(2.0)
    assert h.job_list() == []
    await h.send(chat(FACTS[3]))
    jobs = await h.wait_jobs(1)
    assert ranges(jobs) == [("s1", 0, 4, TriggerReason.THRESHOLD)]
    assert [m.content for m in jobs[0].messages] == FACTS[:4]


async def test_coalescing_under_burst(harness):
    h = await harness()
    h.worker()
    await h.send(*[chat(t) for t in FACTS[:4]])
    first = (await h.wait_jobs(1))[0]
    await h.send(*[chat(f"burst fact number {i}") for i in range(30)])
    await h.jobs.settle(2.0)
    assert len(h.job_list()) == 1  # one job in flight: the burst only sets dirty
    await h.complete(first)
    jobs = await h.wait_jobs(2)
    await h.jobs.settle(1.5)
    assert ranges(h.job_list())[1:] == [("s1", 4, 34, TriggerReason.THRESHOLD)]
    assert len(jobs[1].messages) == 30 and [m.seq for m in jobs[1].context] == [0, 1, 2, 3]


async def test_explicit_trigger_below_threshold(harness):
    h = await harness()
    h.worker()
    await h.send(chat("hello, I'm planning a trip"), chat("记住：我对花生过敏"))
    jobs = await h.wait_jobs(1)
    assert ranges(jobs) == [("s1", 0, 2, TriggerReason.EXPLICIT)]


async def test_session_end_flushes(harness):
    h = await harness()
    h.worker()
    await h.send(chat(FACTS[0]), chat(FACTS[1]), end())
    jobs = await h.wait_jobs(1)
    assert ranges(jobs) == [("s1", 0, 2, TriggerReason.SESSION_END)]


async def test_idle_timeout_flushes(harness):
    h = await harness(idle_timeout_s=2.0)
    h.worker()
    await h.send(chat(FACTS[0]))
    await h.jobs.settle(1.0)
    assert h.job_list() == []
    jobs = await h.wait_jobs(1, timeout=20)
    assert ranges(jobs) == [("s1", 0, 1, TriggerReason.IDLE)]


async def test_three_interleaved_sessions_of_one_user(harness):
    h = await harness()
    h.worker()
    for i in range(4):
        await h.send(*[chat(f"{s} fact {i}", session=s) for s in ("A", "B", "C")])
    seen = []
    for n in range(1, 4):
        jobs = await h.wait_jobs(n)
        await h.jobs.settle(1.0)
        assert len(h.job_list()) == n, "a second job was emitted while one was in flight"
        seen.append(jobs[-1])
        await h.complete(jobs[-1])
    assert sorted((j.session_id, j.from_seq, j.to_seq) for j in seen) == [
        ("A", 0, 4), ("B", 0, 4), ("C", 0, 4)]
    await h.jobs.settle(1.5)
    assert len(h.job_list()) == 3


async def test_duplicate_message_ids_count_once(harness):
    h = await harness()
    h.worker()
    dup = chat(FACTS[0], mid="same-id")
    await h.send(dup, dup, dup, chat(FACTS[1]), chat(FACTS[2]))
    await h.jobs.settle(2.0)
    assert h.job_list() == []  # 3 distinct messages: below the threshold
    await h.send(dup, chat(FACTS[3]))
    jobs = await h.wait_jobs(1)
    assert next(m.message_id for m in jobs[0].messages) == "same-id"
    assert len({m.message_id for m in jobs[0].messages}) == 4 == jobs[0].to_seq


async def test_all_trivial_job_costs_no_extraction(harness):
    h = await harness()
    h.worker()
    await h.send(chat("ok"), chat("Sure, anything else?", role="assistant"), chat("谢谢"),
                 chat("继续"))
    await h.results.wait_for(lambda rs: len(rs) >= 1)
    res = JobResult.model_validate_json(h.results.records[0].value)
    assert res.status == JobStatus.TRIVIAL and (res.from_seq, res.to_seq) == (0, 4)
    await h.jobs.settle(1.5)
    assert h.job_list() == []


async def test_bad_input_goes_to_dead_letters_and_nothing_valid_is_lost(harness):
    h = await harness(max_content_chars=1000)
    h.worker()
    good = chat(FACTS[0]).model_dump(mode="json")
    bad = [
        (b"{not json", b"acme/u1", "not_json"),
        (json.dumps({**good, "role": 5}).encode(), b"acme/u1", "schema"),
        (json.dumps({k: v for k, v in good.items() if k != "user_id"}).encode(),
         b"acme/u1", "schema"),
        (json.dumps({**good, "schema_version": 99}).encode(), b"acme/u1", "version"),
        (json.dumps({**good, "content": ""}).encode(), b"acme/u1", "empty"),
        (json.dumps({**good, "content": "x" * 5000}).encode(), b"acme/u1", "too_large"),
        (json.dumps({**good, "user_id": "../../etc"}).encode(), b"acme/../../etc", "schema"),
        (json.dumps(good).encode(), b"acme/someone-else", "key"),
    ]
    for i, (value, key, _) in enumerate(bad):
        await h.send_raw(value, key)
        await h.send(chat(FACTS[i % 4], mid=f"good-{i}"))
    await h.dlq.wait_for(lambda rs: len(rs) >= len(bad))
    letters = [DeadLetter.model_validate_json(r.value) for r in h.dlq.records]
    by_value = {base64.b64decode(d.value_b64): d for d in letters}
    for value, _, kind in bad:
        assert by_value[value].kind == kind and by_value[value].reason
    jobs = await h.wait_jobs(1)
    assert [m.message_id for m in jobs[0].messages] == [f"good-{i}" for i in range(4)]


async def test_users_do_not_share_state(harness):
    h = await harness()
    h.worker()
    await h.send(*[chat(t, user="alice") for t in FACTS[:3]])
    await h.send(*[chat(t, user="bob") for t in FACTS[:3]])
    await h.jobs.settle(2.0)
    assert h.job_list() == []
    await h.send(chat(FACTS[3], user="bob"))
    jobs = await h.wait_jobs(1)
    assert [(j.user_id, j.to_seq) for j in jobs] == [("bob", 4)]


@pytest.mark.parametrize("crash", [False, True], ids=["graceful", "sigkill"])
async def test_worker_restart_recovers_state_from_changelog(harness, crash):
    h = await harness()
    w = h.worker()
    await h.send(*[chat(t) for t in FACTS[:4]])
    first = (await h.wait_jobs(1))[0]
    await h.send(*[chat(t) for t in FACTS[4:7]])  # 3 more while the job is in flight
    await asyncio.sleep(2.5)  # past the commit interval
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
