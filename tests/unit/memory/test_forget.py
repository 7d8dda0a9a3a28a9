"""Forget-me (SPEC §7): the ingest machine drops the user's buffered content and runs the
erasure next; the apply step deletes every record of exactly that user (the cursor stays,
fencing older jobs); the audit record carries no content; a rebuild from sealed change
events whose key is shredded holds nothing of the user."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memstream.memory.applying import apply_change, apply_decision, build_decision
from memstream.memory.coalescing import on_result, on_tool
from memstream.memory.crypto import change_sealing
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, RulesModel
from memstream.memory.fencing import Verdict
from memstream.memory.store import Scope
from memstream.memory.store.rebuild_fold import rebuild
from memstream.sealing import envelope as crypto
from memstream.topics.schemas import JobResult, JobStatus
from tests.unit.builders import P, feed, forget_request, fresh, make_store, memory, tool_request

pytestmark = pytest.mark.unit
CANARY = "Lives in canary-town-41"


def test_the_machine_drops_buffered_content_and_runs_the_erasure_next():
    state, jobs = feed(fresh(), ["I live in canary-town-41", "x y", "z w", "u v"])
    assert state.in_flight is not None and jobs  # an extraction job is in flight
    state, _ = feed(state, ["I have two kids"])
    step = on_tool(state, forget_request(), 10.0, P)
    [job] = step.jobs
    assert job.tool is not None and job.tool.name == "forget" and job.seq > jobs[0].seq
    assert step.state.sessions == {}  # no message text left in the state
    assert step.state.in_flight is not None and step.state.in_flight.job_id == job.job_id
    late = JobResult.for_job(jobs[0], JobStatus.DONE, datetime.fromtimestamp(11, UTC))
    assert on_result(step.state, late, 11.0, P).duplicate  # the let-go job is stale now


@pytest.fixture(params=["edge", "server"])
def store(request, tmp_path):
    s = make_store(request.param, tmp_path, HashingEmbedder().dim)
    yield s
    s.close()


def decide_and_apply(ex: Extractor, job, now: float):
    decision = build_decision(job, ex.decide(job, now), ex.model, now)
    return decision, apply_decision(ex.store, decision)


def test_the_erasure_deletes_exactly_the_user_and_fences_older_jobs(store):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    mine = [memory(CANARY, mid="a"), memory("Has two kids", mid="b", version=2)]
    theirs = [memory("Lives in Oslo", mid="x", user="u2")]
    store.write(mine + theirs, ex.embedder.embed([m.content for m in mine + theirs]))
    insert = on_tool(fresh(), tool_request("The user likes tea", rid="t-1"), 1.0, P)
    [older] = insert.jobs  # decided but not yet applied when the forget-me comes
    older_decision = build_decision(older, ex.decide(older, 1.0), ex.model, 1.0)
    step = on_tool(insert.state, forget_request(), 2.0, P)
    [job] = step.jobs
    _, applied = decide_and_apply(ex, job, 3.0)
    [audit] = applied.publish
    assert (audit.op, audit.memory_id, audit.lineage.kind) == ("erase", "*", "forget")
    assert audit.after == {"version_records": 2} and CANARY not in audit.model_dump_json()
    assert store.list(Scope("t1", "u1"), statuses=None) == []
    assert store.cursor(Scope("t1", "u1")).seq == job.seq
    assert [m.content for m in store.list(Scope("t1", "u2"))] == ["Lives in Oslo"]
    late = apply_decision(store, older_decision)  # the older job cannot write again
    assert late.verdict == Verdict.FENCED and store.list(Scope("t1", "u1")) == []


def test_a_rebuild_never_resurrects_a_forgotten_user(store, tmp_path):
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    key = crypto.new_data_key()
    log = []
    state = fresh()
    for i, text in enumerate(["The user likes tea", "The user lives in canary-town-41"]):
        step = on_tool(state, tool_request(text, rid=f"t-{i}"), float(i), P)
        [job] = step.jobs
        _, applied = decide_and_apply(ex, job, float(i))
        log += [change_sealing.seal_change(c, "k1", key) for c in applied.publish]
        state = on_result(step.state, JobResult.for_job(
            job, applied.status, datetime.fromtimestamp(i, UTC)), float(i), P).state
    assert len(store.list(Scope("t1", "u1"))) == 2
    # before the forget-me, the sealed log rebuilds the user
    replica = make_store("server", tmp_path, ex.embedder.dim)
    done = rebuild(replica, log, opener=lambda c: change_sealing.open_change(c, {"k1": key}))
    assert (done.changes, done.unreadable) == (2, 0)
    assert len(replica.list(Scope("t1", "u1"))) == 2
    replica.close()
    # forget-me: the key is shredded; the audit record is plain
    step = on_tool(state, forget_request(), 5.0, P)
    _, applied = decide_and_apply(ex, step.jobs[0], 5.0)
    log += applied.publish
    replica = make_store("server", tmp_path, ex.embedder.dim)
    done = rebuild(replica, log, opener=lambda c: change_sealing.open_change(c, {}))
    assert (done.changes, done.unreadable) == (1, 2)
    assert replica.list(Scope("t1", "u1"), statuses=None) == []
    # and a plain log (no master key) is still erased by the replayed audit record
    plain = make_store("server", tmp_path, ex.embedder.dim)
    opened = [change_sealing.open_change(c, {"k1": key}) for c in log]
    assert all(apply_change(plain, c) for c in opened if c is not None)
    assert plain.list(Scope("t1", "u1"), statuses=None) == []
    replica.close()
    plain.close()


def test_a_rebuild_of_one_tenant_never_touches_another(store):
    """Replaying tenant t1's log (adds, an erasure) into a store that holds tenant t2's
    user of the same name leaves t2 exactly as it was."""
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    theirs = [memory("Lives in Oslo", mid="x", tenant="t2"),
              memory("Has two kids", mid="y", tenant="t2", version=2)]
    store.write(theirs, ex.embedder.embed([m.content for m in theirs]))
    before = sorted((m.memory_id, m.version, m.content)
                    for m in store.list(Scope("t2", "u1"), statuses=None))
    state, log = fresh(), []
    for i, req in enumerate([tool_request("The user likes tea", rid="t-1"),
                             forget_request()]):
        step = on_tool(state, req, float(i), P)
        _, applied = decide_and_apply(ex, step.jobs[0], float(i))
        log += applied.publish
        state = on_result(step.state, JobResult.for_job(
            step.jobs[0], applied.status, datetime.fromtimestamp(i, UTC)), float(i), P).state
    assert [c.tenant_id for c in log] == ["t1", "t1"]
    done = rebuild(store, log)
    assert done.changes >= 1
    after = sorted((m.memory_id, m.version, m.content)
                   for m in store.list(Scope("t2", "u1"), statuses=None))
    assert after == before and store.list(Scope("t1", "u1"), statuses=None) == []


def test_messages_written_before_the_forget_and_read_after_it_are_dropped():
    from memstream.memory.coalescing import next_deadline, on_message, on_tick
    from memstream.memory.ingest_state import restore, snapshot
    from tests.unit.builders import msg

    step = on_tool(fresh(), forget_request(), 10.0, P)  # asked at 2026-01-01 (the ts)
    state = restore(snapshot(step.state))  # survives the changelog
    asked = state.forgotten_before
    assert asked is not None
    old = msg("I live in canary-town-41", mid="old-1").model_copy(
        update={"ts": datetime.fromtimestamp(asked - 5, UTC)})
    new = msg("I live in Oslo", mid="new-1").model_copy(
        update={"ts": datetime.fromtimestamp(asked + 5, UTC)})
    assert on_message(state, old, 11.0, P).duplicate
    assert not on_message(state, new, 11.0, P).duplicate
    assert next_deadline(state, P) is not None
    from dataclasses import replace

    done = replace(state, in_flight=None, tools=())  # the erasure ran
    later = on_tick(done, asked + P.forget_after_s + 1, P).state
    assert later.forgotten_before is None and later.idle
