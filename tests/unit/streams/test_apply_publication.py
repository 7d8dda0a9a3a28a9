"""Publication (issue 15, I3): the store never holds a change the memory-change topic may lack.

A SIGKILL can abort the Kafka transaction that held a job's change events after the store
took the job. Whichever decision of that job is seen next (the same one, a twin decided at
another time, one decided against the newer store, the extract stage's skip, a failed
attempt), the events of the decision the store applied are published again, byte for byte
(one change id, one payload ever), then the job's result. Decision ids carry no wall clock.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memstream.contract.events import MemoryEvent
from memstream.memory.applying import apply_decision, build_decision
from memstream.memory.coalescing import on_tool
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, RulesModel
from memstream.memory.fencing import Cursor, Verdict, decision_id, timeless
from memstream.memory.store import Scope, checksum
from memstream.memory.store.rebuild_fold import rebuild
from memstream.streams.apply import publish
from memstream.streams.counters import Counters
from memstream.streams.extract import failed_decision, skip_decided
from memstream.streams.stage import Work
from memstream.topics.publishing import public_event
from memstream.topics.schemas import JobResult, JobStatus, MemoryChange
from tests.unit.builders import P, forget_request, fresh, job, live, make_store

pytestmark = pytest.mark.unit
SCOPE = Scope("t1", "u1")
TEXTS = ["I live in Oslo", "I am allergic to nuts"]


@pytest.fixture(params=["edge", "server"])
def store(request, tmp_path):
    s = make_store(request.param, tmp_path, HashingEmbedder().dim)
    yield s
    s.close()


def decide(ex, texts, now, seq, job_id="job-1"):
    j = job(texts, job_id=job_id).model_copy(update={"seq": seq})
    return build_decision(j, ex.decide(j, now), ex.model, now)


def wire(changes: list[MemoryChange]) -> list[bytes]:
    return [c.dumps() for c in changes]


# --- decision ids: no wall clock --------------------------------------------------------------

def test_timeless_drops_every_wall_clock_field_at_any_depth():
    value = {"decided_at": 1, "reason": "r", "records": [
        {"created_at": 2, "updated_at": 3, "valid_from": 4, "valid_to": 5, "expires_at": 6,
         "last_accessed_at": 7, "version": 2, "extra": {"decayed_at": 8, "weight": 0.5}}]}
    assert timeless(value) == {"reason": "r", "records": [{"version": 2,
                                                           "extra": {"weight": 0.5}}]}
    assert decision_id([value]) == decision_id([{**value, "decided_at": 99}])


def test_the_same_job_decided_to_the_same_ops_at_two_times_has_one_decision_id(store):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    early, late = decide(ex, TEXTS, 10.0, 1), decide(ex, TEXTS, 5_000.0, 1)
    assert [c.decided_at for c in early.changes] != [c.decided_at for c in late.changes]
    assert [c.change_id for c in early.changes] == [c.change_id for c in late.changes]
    assert early.decision_id == late.decision_id
    assert decide(ex, ["I live in Rome"], 10.0, 1).decision_id != early.decision_id  # other ops
    assert decide(ex, TEXTS, 10.0, 2).decision_id != early.decision_id  # another job number


# --- the apply path: the kept events, whichever decision comes -------------------------------

def test_another_decision_of_the_applied_job_publishes_its_lost_events_again(store):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    first = apply_decision(store, decide(ex, TEXTS, 10.0, 1))
    lost = wire(first.publish)  # their transaction was aborted by a SIGKILL
    assert len(lost) == 2
    again = decide(ex, TEXTS, 20.0, 1)  # re-consumed, decided against the newer store
    assert again.changes == [], "a restatement now: another decision of the job"
    out = apply_decision(store, again)
    assert (out.verdict, out.status) == (Verdict.DONE, JobStatus.DONE)
    assert wire(out.publish) == lost
    assert live(store) == ["Allergic to nuts", "Lives in Oslo"]


def test_a_twin_decision_publishes_the_stored_payloads_never_its_own(store):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    applied, twin = decide(ex, TEXTS, 10.0, 1), decide(ex, TEXTS, 99.0, 1)  # both in flight
    first = apply_decision(store, applied)
    out = apply_decision(store, twin)
    assert out.verdict == Verdict.REPUBLISH and out.status == JobStatus.DONE
    assert wire(out.publish) == wire(first.publish) != wire(twin.changes)
    assert {m.valid_from for m in store.list(SCOPE, statuses=None)} == {10.0}, "not rewritten"


@pytest.mark.parametrize("kind", ["failed", "fenced"])
def test_a_decision_without_changes_of_the_applied_job_reports_done_with_the_events(store, kind):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    first = apply_decision(store, decide(ex, TEXTS, 10.0, 1))
    j = job(TEXTS).model_copy(update={"seq": 1})
    stand_in = failed_decision(j, "timeout") if kind == "failed" else failed_decision(
        j, "skipped").model_copy(update={"status": JobStatus.FENCED, "applied_seq": 1})
    out = apply_decision(store, stand_in)
    assert (out.verdict, out.status, out.error) == (Verdict.DONE, JobStatus.DONE, None)
    assert wire(out.publish) == wire(first.publish)


def test_only_the_cursor_jobs_own_events_are_published_again(store):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    apply_decision(store, decide(ex, TEXTS, 10.0, 1))
    noop = decide(ex, ["I live in Oslo"], 20.0, 2, job_id="job-2")
    assert noop.changes == [] and apply_decision(store, noop).publish == []
    again = apply_decision(store, noop)
    assert again.verdict == Verdict.REPUBLISH and again.publish == [], "never job 1's events"
    # a cursor a replay or a store switch wrote keeps nothing: its job's events are on the
    # topic already
    store.set_cursor(SCOPE, Cursor(3, "job-3"))
    j3 = job(["x"], job_id="job-3").model_copy(update={"seq": 3})
    out = apply_decision(store, failed_decision(j3, "timeout"))
    assert out.verdict == Verdict.DONE and out.publish == []


def test_the_kept_events_are_bookkeeping_hidden_from_memories_and_checksums(store, tmp_path):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    first = apply_decision(store, decide(ex, TEXTS, 10.0, 1))
    kept = store.published(SCOPE)
    assert kept is not None and kept.job == store.cursor(SCOPE)
    assert [text.encode() for text in kept.changes] == wire(first.publish)
    assert len(store.list(SCOPE, statuses=None)) == store.count() == 2
    rebuilt = make_store("server", tmp_path / "rebuilt", HashingEmbedder().dim)
    rebuild(rebuilt, first.publish)
    assert checksum.compare(checksum.digests(store.scan(vectors=True)),
                            checksum.digests(rebuilt.scan(vectors=True))).ok
    rebuilt.close()


def test_a_forget_me_erases_the_kept_events_and_keeps_only_its_audit_record(store):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    apply_decision(store, decide(ex, TEXTS, 10.0, 1))
    [forget] = on_tool(fresh(), forget_request(), 20.0, P).jobs
    forget = forget.model_copy(update={"seq": 2})
    erased = apply_decision(store, build_decision(forget, ex.decide(forget, 20.0), ex.model,
                                                  20.0))
    [audit] = erased.publish
    kept = store.published(SCOPE)
    assert kept is not None and [MemoryChange.model_validate_json(t) for t in kept.changes] == [
        audit]
    assert not any("Oslo" in str(payload) for _, payload, _ in store.scan("t1", "u1"))


# --- the stages: the extract stage's skip, the events before the result --------------------

def pipeline(store) -> SimpleNamespace:
    return SimpleNamespace(
        services=SimpleNamespace(store=store), counters=Counters(), user_keys=None,
        topics=SimpleNamespace(memory_changes=SimpleNamespace(name="changes"),
                               memory_events=SimpleNamespace(name="events"),
                               job_results=SimpleNamespace(name="results")),
        waiters=SimpleNamespace(resolve=lambda *_: None), clock=lambda: 100.0)


async def test_the_extract_skip_of_the_applied_job_republishes_then_sends_the_result(tmp_path):
    store = make_store("server", tmp_path, HashingEmbedder().dim)
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    first = apply_decision(store, decide(ex, TEXTS, 10.0, 1))
    p = pipeline(store)
    skipped = await skip_decided(p, job(TEXTS).model_copy(update={"seq": 1}))  # no LLM call
    assert skipped is not None and p.counters.jobs_skipped == 1
    applied = apply_decision(store, skipped)
    work = Work()
    await publish(p, work, b"t1/u1", skipped, applied)
    lost = wire(first.publish)
    assert work.out[:-1:2] == [("changes", b"t1/u1", v) for v in lost]
    # each change event followed by its public event, the same change, same transaction
    events = [MemoryEvent.model_validate_json(v) for t, _, v in work.out[1:-1:2] if t == "events"]
    assert [e.change_id for e in events] == [c.change_id for c in first.publish]
    assert events == [public_event(c) for c in first.publish]
    topic, _, value = work.out[-1]
    assert topic == "results" and JobResult.model_validate_json(value).status == JobStatus.DONE
    assert p.counters.decisions_duplicate == 0  # counted once the transaction is committed
    for step in work.after:
        await step()
    assert p.counters.decisions_duplicate == 1
    store.close()
