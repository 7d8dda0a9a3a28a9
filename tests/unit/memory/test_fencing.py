"""Effects exactly once, in job order: the fencing rules, pure and against both stores.

The scenario of the issue: job A ("I live in Dublin", a restatement: NOOP), then job B
(Dublin -> Buenos Aires). After a restart A is consumed again and decided again against
the newer store; without fencing that decision moves the user back to Dublin.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from memstream.memory.applying import apply_decision, build_decision
from memstream.memory.coalescing import (
    Policy,
    UserState,
    on_message,
    on_result,
    on_tick,
)
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, RulesModel
from memstream.memory.fencing import Cursor, Touch, Verdict, decide_or_skip, moved_on, verdict
from memstream.memory.ingest_state import restore, snapshot
from memstream.memory.store import Scope
from memstream.topics.schemas import JobStatus
from tests.unit.builders import job, live, msg, result

pytestmark = pytest.mark.unit
C = Cursor(5, "job-5", "d-5")


@pytest.mark.parametrize(("cursor", "seq", "job_id", "decision", "expected"), [
    (None, 1, "j", "d", Verdict.APPLY),
    (C, 6, "j", "d", Verdict.APPLY),  # the next job
    (C, 5, "job-5", "d-5", Verdict.REPUBLISH),  # the very decision applied, seen again
    (C, 5, "job-5", "other", Verdict.DONE),  # the same job decided twice: first one wins
    (C, 5, "job-5", "", Verdict.DONE),  # no decision (a failed or skipped job)
    (Cursor(5, "job-5"), 5, "job-5", "", Verdict.DONE),  # nor a cursor a replay wrote
    (C, 5, "job-x", "d-5", Verdict.FENCED),  # another job under the same seq
    (C, 4, "job-4", "d-4", Verdict.FENCED),  # an older job replayed
    (C, 0, "legacy", "d", Verdict.APPLY),  # unsequenced: op-id idempotency only
])
def test_verdict(cursor, seq, job_id, decision, expected):
    assert verdict(cursor, seq, job_id, decision) == expected


def test_a_job_at_or_below_the_cursor_is_not_decided_again():
    assert decide_or_skip(C, 6, "j") == Verdict.APPLY
    assert decide_or_skip(C, 5, "job-5") == Verdict.DONE
    assert decide_or_skip(C, 3, "job-3") == Verdict.FENCED


@pytest.mark.parametrize(("read", "live_now", "touches", "applied", "stale"), [
    ({"m": 1}, {"m": 1}, [Touch("c1", "m", 1, 2)], set(), None),
    ({"m": 1}, {"m": 2}, [Touch("c1", "m", 1, 2)], set(), "m"),  # moved on: refuse
    ({"m": 1}, {"m": 2}, [Touch("c1", "m", 1, 2)], {"c1"}, None),  # half-applied by us
    ({"m": 1}, {}, [Touch("c1", "m", 1, None)], {"c1"}, None),  # our DELETE went through
    ({"m": 1}, {}, [], set(), "m"),  # read but deleted since
    ({}, {"n": 1}, [Touch("c1", "n", None, 1)], set(), "n"),  # our ADD's memory exists?!
    ({"m": 1}, {"m": 3},  # two changes of one memory in one job, the first applied
     [Touch("c1", "m", 1, 2), Touch("c2", "m", 2, 3)], {"c1", "c2"}, None),
    ({"m": 1}, {"m": 2}, [Touch("c1", "m", 1, 2), Touch("c2", "m", 2, 3)], {"c1"}, None),
])
def test_moved_on(read, live_now, touches, applied, stale):
    assert moved_on(read, live_now, touches, applied) == stale


def decide(ex, j, now, seq):
    j = j.model_copy(update={"seq": seq})
    return build_decision(j, ex.decide(j, now), ex.model, now)


def test_an_old_job_decided_again_never_rolls_a_fact_back(store):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    first = apply_decision(store, decide(ex, job(["I live in Dublin"], job_id="j0"), 10, 1))
    assert first.verdict == Verdict.APPLY and [c.op for c in first.publish] == ["add"]
    a = decide(ex, job(["I live in Dublin"], job_id="jA"), 20, 2)
    assert a.changes == []  # a restatement: NOOP
    assert apply_decision(store, a).status == JobStatus.DONE
    b = decide(ex, job(["We moved from Dublin to Buenos Aires"], job_id="jB"), 30, 3)
    assert apply_decision(store, b).status == JobStatus.DONE
    assert live(store) == ["Lives in Buenos Aires"]

    again = decide(ex, job(["I live in Dublin"], job_id="jA"), 40, 2)  # after a restart
    assert again.changes, "decided against the newer store, A now wants to move back"
    out = apply_decision(store, again)
    assert out.status == JobStatus.FENCED and out.publish == [] and out.applied_seq == 3
    assert live(store) == ["Lives in Buenos Aires"]
    assert store.cursor(Scope("t1", "u1")) == Cursor(3, "jB", b.decision_id)


def test_a_decision_seen_again_is_republished_never_reapplied(store):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    d = decide(ex, job(["I live in Oslo", "I am allergic to nuts"]), 10, 1)
    first = apply_decision(store, d)
    again = apply_decision(store, d)
    assert again.verdict == Verdict.REPUBLISH
    assert [c.model_dump() for c in again.publish] == [c.model_dump() for c in first.publish]
    twin = decide(ex, job(["I live in Oslo", "I am allergic to nuts"]), 11, 1)  # re-decided
    assert twin.changes == []  # against the newer store: other ops (none), another id
    dup = apply_decision(store, twin)
    assert dup.verdict == Verdict.DONE and dup.status == JobStatus.DONE
    assert [c.dumps() for c in dup.publish] == [c.dumps() for c in first.publish], (
        "the applied decision's events again, never the twin's: one change id, one payload")
    assert live(store) == ["Allergic to nuts", "Lives in Oslo"]


def test_a_decision_whose_memory_moved_on_is_refused_whole(store):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    apply_decision(store, decide(ex, job(["I live in Rome"], job_id="j1"), 10, 1))
    stale = decide(ex, job(["We moved from Rome to Paris", "I am allergic to cats"],
                           job_id="j3"), 20, 3)  # reads Rome v1
    apply_decision(store, decide(ex, job(["We moved from Rome to Milan"], job_id="j2"), 15, 2))
    out = apply_decision(store, stale)
    assert out.status == JobStatus.FENCED and "moved on" in (out.error or "")
    assert live(store) == ["Lives in Milan"], "nothing of a refused decision is written"
    assert store.cursor(Scope("t1", "u1")).seq == 2


def test_a_half_applied_decision_is_completed_by_its_replay(store):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    apply_decision(store, decide(ex, job(["I live in Rome"], job_id="j1"), 10, 1))
    move = decide(ex, job(["We moved from Rome to Paris"], job_id="j2"), 20, 2)
    update = move.changes[0]
    from memstream.memory.model import Memory

    opened = [Memory.from_payload(r) for r in update.records if r["version"] == 2]
    store.write(opened, [update.vector])  # the worker died after the first write
    assert sorted(live(store)) == ["Lives in Paris", "Lives in Rome"]
    out = apply_decision(store, move)
    assert out.verdict == Verdict.APPLY and live(store) == ["Lives in Paris"]


def test_cursor_is_invisible_to_memory_queries(store):
    store.set_cursor(Scope("t1", "u1"), Cursor(7, "j7", "d7"))
    assert store.list(Scope("t1", "u1"), statuses=None) == []
    assert store.cursor(Scope("t1", "u1")) == Cursor(7, "j7", "d7")
    assert store.cursor(Scope("t1", "u2")) is None
    assert store.cursor(Scope("t2", "u1")) is None


# --- the ingest side: sequence numbers ----------------------------------------------------

P = Policy(min_new_messages=2, job_timeout_s=50, retry_backoff_s=10)


def two(state, now, *texts):
    for t in texts:
        step = on_message(state, msg(t), now, P)
        state = step.state
    return step


def test_jobs_get_strictly_increasing_seqs_and_a_resend_keeps_its_seq():
    s1 = two(UserState("t1", "u1"), 0.0, "I live in Oslo", "I work at Acme")
    first = s1.jobs[0]
    resent = on_tick(s1.state, 60.0, P).jobs[0]
    assert (resent.job_id, resent.seq) == (first.job_id, first.seq) == (first.job_id, 1)
    done = on_result(s1.state, result(first), 61.0, P).state
    s2 = two(done, 62.0, "I have 2 kids", "I am vegetarian")
    assert s2.jobs[0].seq == 2
    assert restore(snapshot(s2.state)).next_seq == 3


def test_a_result_of_another_attempt_of_the_same_range_is_stale():
    s1 = two(UserState("t1", "u1"), 0.0, "I live in Oslo", "I work at Acme")
    wrong = result(s1.jobs[0]).model_copy(update={"seq": 9})
    assert on_result(s1.state, wrong, 1.0, P).duplicate


def test_fenced_job_is_reissued_above_the_stores_seq():
    s1 = two(UserState("t1", "u1"), 0.0, "I live in Oslo", "I work at Acme")
    fenced = result(s1.jobs[0], JobStatus.FENCED).model_copy(update={"applied_seq": 41})
    again = on_result(s1.state, fenced, 1.0, P)
    assert [(j.seq, j.from_seq, j.to_seq) for j in again.jobs] == [(42, 0, 2)]
    held = replace_seq(fenced, again.jobs[0]).model_copy(update={"applied_seq": 42})
    twice = on_result(again.state, held, 2.0, P)
    assert twice.jobs == [], "a repeated fence backs off"
    assert on_tick(twice.state, 2.0 + P.retry_backoff_s, P).jobs[0].seq == 43


def test_a_job_fenced_below_its_seq_goes_again_as_itself_and_stays_in_flight():
    """A memory the decision read moved on, and the store holds no job of its seq (another
    copy of the job wrote it and was killed before its cursor): the same job goes again
    at once, and the other copy's result, when it comes, still closes it."""
    s1 = two(UserState("t1", "u1"), 0.0, "I live in Oslo", "I work at Acme")
    job = s1.jobs[0]
    moved = result(job, JobStatus.FENCED).model_copy(update={"applied_seq": 0})
    again = on_result(s1.state, moved, 1.0, P)
    [same] = again.jobs
    assert (same.job_id, same.seq, same.from_seq, same.to_seq) == (job.job_id, 1, 0, 2)
    assert same.attempt == 2 and again.state.in_flight is not None
    twice = on_result(again.state, moved, 2.0, P)
    assert twice.jobs == [] and twice.state.in_flight is not None, "a repeat backs off"
    [third] = on_tick(twice.state, 2.0 + P.retry_backoff_s, P).jobs
    assert (third.job_id, third.seq) == (job.job_id, 1)
    closed = on_result(twice.state, result(job), 3.0, P)  # the other copy's DONE
    assert not closed.duplicate and closed.state.in_flight is None
    assert closed.state.sessions[job.session_id].watermark == 2


def replace_seq(res, job):
    return res.model_copy(update={"seq": job.seq, "job_id": job.job_id})


def test_old_snapshots_without_seqs_still_restore():
    s1 = two(UserState("t1", "u1"), 0.0, "I live in Oslo", "I work at Acme")
    snap = snapshot(s1.state)
    snap.pop("next_seq")
    snap["in_flight"] = {k: v for k, v in snap["in_flight"].items() if k != "seq"}
    old = restore(snap)
    assert old.next_seq == 1 and old.in_flight is not None and old.in_flight.seq == 0
    assert replace(old, next_seq=1) == old
