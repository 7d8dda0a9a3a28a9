"""An agent's tool writes: queued by the coalescing machine as jobs of their own kind, decided
(memory.toolwrite) and applied through the same decision / apply path as extraction."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from memstream.memory.applying import apply_decision, build_decision
from memstream.memory.coalescing import (
    TOOL_SESSION,
    next_deadline,
    on_result,
    on_tick,
    on_tool,
    tool_job_id,
)
from memstream.memory.decisions import Decision
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, RulesModel, Usage
from memstream.memory.ingest_state import restore, snapshot
from memstream.memory.model import OpKind, Status
from memstream.memory.store import Scope
from memstream.topics.schemas import JobResult, JobStatus, TriggerReason
from tests.unit.builders import P, feed, fresh, make_store, result, tool_request

pytestmark = pytest.mark.unit

FACTS = ["f1 x", "f2 x", "f3 x", "f4 x"]


# --- the queue ------------------------------------------------------------------------------

def test_a_tool_write_goes_out_at_once_as_a_job_of_its_own_kind():
    step = on_tool(fresh(), tool_request("Likes tea", rid="c1"), 5.0, P)
    [job] = step.jobs
    assert (job.reason, job.messages, job.seq, job.session_id) == (
        TriggerReason.TOOL, [], 1, TOOL_SESSION)
    assert job.job_id == tool_job_id("t1", "u1", "c1")
    assert (job.tool.content, job.tool.request_id) == ("Likes tea", "c1")
    flight = step.state.in_flight
    assert (flight.kind, flight.seq, step.state.next_seq) == ("tool", 1, 2)
    assert on_tool(fresh(), tool_request(rid="c2", session="s9"), 5.0, P).jobs[0].session_id == "s9"


def test_a_retried_request_id_is_taken_once():
    step = on_tool(fresh(), tool_request(rid="c1"), 0.0, P)
    again = on_tool(step.state, tool_request(rid="c1"), 1.0, P)
    assert again.duplicate and again.jobs == [] and len(again.state.tools) == 1
    done = on_result(step.state, result(step.jobs[0]), 2.0, P).state
    assert done.tools == () and on_tool(done, tool_request(rid="c1"), 3.0, P).duplicate


def test_a_request_retried_after_its_job_finished_is_taken_once_until_forgotten():
    p = replace(P, forget_after_s=1000.0)
    step = on_tool(fresh(), tool_request(rid="c1"), 0.0, p)
    state = on_result(step.state, result(step.jobs[0]), 1.0, p).state
    assert not state.idle  # the ingest stage keeps it: the id taken is still remembered
    assert on_tool(state, tool_request(rid="c1"), 2.0, p).duplicate
    assert next_deadline(state, p) == 1000.0
    assert on_tick(state, 999.0, p).state == state
    forgotten = on_tick(state, 1000.0, p).state
    assert forgotten.recent_tools == () and forgotten.idle


def test_tool_and_extraction_jobs_of_a_user_are_never_in_flight_together():
    state, [extract] = feed(fresh(), FACTS)
    step = on_tool(state, tool_request(rid="c1"), 1.0, P)
    assert step.jobs == [] and step.state.in_flight.kind == "extract"
    state, _ = feed(step.state, ["f5 x", "f6 x", "f7 x", "f8 x"])  # due again meanwhile
    step = on_result(state, result(extract), 2.0, P)
    [tool] = step.jobs  # the queued tool goes before the due extraction
    assert tool.reason == TriggerReason.TOOL and tool.seq > extract.seq
    state, more = feed(step.state, ["f9 x", "f10 x", "f11 x", "f12 x"])
    assert more == [] and state.in_flight.kind == "tool"
    step = on_result(state, result(tool), 3.0, P)
    [follow] = step.jobs
    assert follow.reason == TriggerReason.THRESHOLD and follow.seq > tool.seq
    assert (follow.from_seq, follow.to_seq) == (4, 12) and step.state.tools == ()


def answer(state, status=JobStatus.DONE) -> JobResult:
    """The result of the job in flight, as the apply stage sends it."""
    f = state.in_flight
    return JobResult(job_id=f.job_id, seq=f.seq, tenant_id="t1", user_id="u1",
                     session_id=f.session_id, from_seq=f.from_seq, to_seq=f.to_seq,
                     status=status, finished_at=datetime(2026, 1, 1, tzinfo=UTC))


def test_queued_tools_go_one_at_a_time_in_arrival_order():
    state = fresh()
    for rid in ("a", "b", "c"):
        state = on_tool(state, tool_request(rid=rid), 0.0, P).state
    sent = []
    while state.in_flight is not None:
        rid = state.tools[0].request_id
        assert state.in_flight.job_id == tool_job_id("t1", "u1", rid)
        sent.append((rid, state.in_flight.seq))
        status = JobStatus.FAILED if rid == "b" else JobStatus.DONE
        state = on_result(state, answer(state, status), 1.0, P).state
    assert sent == [("a", 1), ("b", 2), ("c", 3)]  # a failed tool job leaves the queue too
    assert state.tools == () and [r for r, _ in state.recent_tools] == ["a", "b", "c"]


def test_a_fenced_tool_result_reissues_under_a_seq_above_the_store():
    step = on_tool(fresh(), tool_request(rid="c1"), 0.0, P)
    fenced = result(step.jobs[0], JobStatus.FENCED).model_copy(update={"applied_seq": 41})
    again = on_result(step.state, fenced, 1.0, P)
    [job] = again.jobs
    assert (job.job_id, job.seq) == (step.jobs[0].job_id, 42)
    assert again.state.next_seq == 43 and len(again.state.tools) == 1
    stale = on_result(again.state, result(step.jobs[0]), 2.0, P)  # the old seq's answer
    assert stale.duplicate and stale.state == again.state


def test_a_tool_job_fenced_below_its_seq_goes_again_as_itself_and_stays_in_flight():
    """What it read moved on, or is another copy's half-applied write, and the store holds
    no job of its seq: the same tool job goes again (at once, then with backoff), so the
    other copy's result still finds it; under a new seq, that copy would be fenced for
    good and its write never published."""
    step = on_tool(fresh(), tool_request(rid="c1"), 0.0, P)
    first = step.jobs[0]
    fenced = result(first, JobStatus.FENCED).model_copy(update={"applied_seq": 0})
    again = on_result(step.state, fenced, 1.0, P)
    [same] = again.jobs
    assert (same.job_id, same.seq, same.tool, same.attempt) == (first.job_id, 1, first.tool, 2)
    assert again.state.next_seq == step.state.next_seq and again.state.in_flight is not None
    twice = on_result(again.state, fenced, 2.0, P)
    assert twice.jobs == [] and twice.state.in_flight is not None, "a repeat backs off"
    [third] = on_tick(twice.state, 2.0 + P.retry_backoff_s, P).jobs
    assert (third.job_id, third.seq) == (first.job_id, 1)
    done = on_result(twice.state, result(first), 3.0, P)  # the other copy's DONE
    assert not done.duplicate and done.state.in_flight is None and done.state.tools == ()


def test_an_unanswered_tool_job_is_resent_under_the_same_id_and_seq():
    step = on_tool(fresh(), tool_request(rid="c1"), 0.0, P)
    assert next_deadline(step.state, P) == 50.0
    assert on_tick(step.state, 49.0, P).jobs == []
    [job] = on_tick(step.state, 50.0, P).jobs
    assert (job.job_id, job.seq, job.attempt) == (step.jobs[0].job_id, 1, 2)
    assert job.tool == step.jobs[0].tool


def test_snapshot_round_trip_keeps_the_tool_queue():
    state, _ = feed(fresh(), ["f1 x", "f2 x"])
    for rid in ("a", "b"):
        state = on_tool(state, tool_request(f"fact {rid}", rid=rid), 0.0, P).state
    assert state.in_flight.kind == "tool" and len(state.tools) == 2
    back = restore(json.loads(json.dumps(snapshot(state))))
    assert back == state
    assert on_tick(back, 60.0, P).jobs[0].tool.content == "fact a"


def test_idle_means_nothing_to_remember():
    busy = on_tool(fresh(), tool_request(), 0.0, P).state
    assert fresh().idle and not busy.idle and not feed(fresh(), ["f1 x"])[0].idle
    assert not replace(busy, in_flight=None).idle  # a tool write still waits
    assert not replace(fresh(), in_flight=busy.in_flight).idle


def test_a_full_queue_refuses_more():
    p = replace(P, max_queued_tools=2)
    state = fresh()
    for rid in ("a", "b"):
        state = on_tool(state, tool_request(rid=rid), 0.0, p).state
    step = on_tool(state, tool_request(rid="c"), 0.0, p)
    assert step.duplicate and step.state == state


# --- decided and applied ----------------------------------------------------------------------

@pytest.fixture(params=["edge", "server"])
def store(request, tmp_path):
    s = make_store(request.param, tmp_path, HashingEmbedder().dim)
    yield s
    s.close()


class Agent:
    """The ingest machine, the extract step and the apply step, wired by hand."""

    def __init__(self, store, model=None) -> None:
        self.ex = Extractor(model or RulesModel(), HashingEmbedder(), store)
        self.state = fresh()
        self.now = 100.0

    def call(self, **kw):
        self.now += 10.0
        step = on_tool(self.state, tool_request(**kw), self.now, P)
        [job] = step.jobs
        out = self.ex.decide(job, self.now)
        decision = build_decision(job, out, self.ex.model, self.now)
        applied = apply_decision(self.ex.store, decision)
        res = JobResult.for_job(job, applied.status, datetime.fromtimestamp(self.now, UTC),
                                applied_seq=applied.applied_seq, error=applied.error)
        self.state = on_result(step.state, res, self.now, P).state
        assert self.state.in_flight is None  # the loop closed: the next call goes at once
        return out, applied


def live(store):
    return sorted((m.content, m.version, m.slot) for m in store.list(Scope("t1", "u1")))


def test_memory_insert_adds_once_and_a_repeat_is_a_noop(store):
    agent = Agent(store)
    out, applied = agent.call(content="The user is allergic to peanuts", rid="c1")
    assert [c.op for c in applied.publish] == ["add"] and out.decisions["add"] == 1
    out, applied = agent.call(content="The user is allergic to peanuts", rid="c2")
    assert applied.publish == [] and out.decisions["noop"] == 1
    assert live(store) == [("The user is allergic to peanuts", 1, None)]


def test_a_tool_change_carries_tool_lineage(store):
    _, applied = Agent(store).call(content="Works night shifts", rid="call-7")
    [change] = applied.publish
    assert change.lineage.kind == "tool" and change.lineage.message_ids == ["call-7"]
    assert change.lineage.job_id == tool_job_id("t1", "u1", "call-7")
    [m] = store.list(Scope("t1", "u1"))
    assert m.source.message_ids == ("call-7",) and m.source.job_id == change.lineage.job_id


def core_call(agent, old, new, rid):
    return agent.call(name="core_memory_replace", label="profile", old=old, content=new,
                      rid=rid)


def test_core_memory_replace_sets_then_updates_the_block(store):
    agent = Agent(store)
    _, applied = core_call(agent, "", "Name: Ann\nCity: Oslo", "c1")
    assert [(c.op, c.version) for c in applied.publish] == [("add", 1)]
    _, applied = core_call(agent, "Oslo", "Bergen", "c2")
    assert [(c.op, c.version) for c in applied.publish] == [("update", 2)]
    assert live(store) == [("Name: Ann\nCity: Bergen", 2, "core:profile")]
    old = [m for m in store.list(Scope("t1", "u1"), statuses=None) if m.version == 1]
    assert [(m.content, m.status) for m in old] == [("Name: Ann\nCity: Oslo", Status.SUPERSEDED)]


def test_core_memory_replace_of_text_not_in_the_block_changes_nothing(store):
    agent = Agent(store)
    core_call(agent, "", "Name: Ann", "c1")
    out, applied = core_call(agent, "Bob", "Robert", "c2")
    assert out.ops == [] and out.error and "not found" in out.error
    assert applied.publish == [] and applied.status == JobStatus.DONE
    assert live(store) == [("Name: Ann", 1, "core:profile")]
    out, _ = agent.call(name="core_memory_replace", label="diary", content="x", rid="c3")
    assert out.ops == [] and "label" in (out.error or "")


class _UpdatesNearest:
    """A decision maker (an LLM, say) that takes the insert for a change of the nearest."""

    name, prompt_version = "fake", "fake-1"

    def decide(self, candidate, shown, threshold):
        return (Decision(OpKind.UPDATE, shown[0][0]) if shown else Decision(OpKind.ADD)), Usage()


def test_memory_insert_never_rewrites_a_core_block(store):
    agent = Agent(store)
    core_call(agent, "", "Name: Ann\nCity: Oslo", "c1")
    agent.ex = Extractor(_UpdatesNearest(), HashingEmbedder(), store)
    agent.call(content="Name of the user's dog: Rex", rid="c2")
    blocks = [m.content for m in store.list(Scope("t1", "u1")) if m.slot == "core:profile"]
    assert blocks == ["Name: Ann\nCity: Oslo"]


def test_jobs_take_turns_by_time_not_by_kind():
    """A tool write and a due extraction go in order of their own time: a tool write never
    overtakes older unscanned messages (their facts first), nor waits behind newer ones."""
    at = {"late": datetime(2026, 1, 1, 0, 5, tzinfo=UTC),  # after the messages (00:00)
          "early": datetime(2025, 12, 31, tzinfo=UTC)}  # before them
    for rid, expected in (("late", TriggerReason.THRESHOLD), ("early", TriggerReason.TOOL)):
        state, [extract] = feed(fresh(), FACTS)
        state, _ = feed(state, ["f5 x", "f6 x", "f7 x", "f8 x"])  # due again meanwhile
        req = tool_request(rid=rid).model_copy(update={"ts": at[rid]})
        state = on_tool(state, req, 1.0, P).state
        [first] = on_result(state, result(extract), 2.0, P).jobs
        assert first.reason == expected, rid
