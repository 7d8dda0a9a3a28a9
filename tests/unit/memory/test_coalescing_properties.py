"""Hypothesis properties of the coalescing machine over random interleavings."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.memory.coalescing import (
    Policy,
    UserState,
    on_message,
    on_result,
    on_session_end,
    on_tick,
)
from memstream.topics.schemas import JobStatus, TriggerReason
from tests.unit.builders import msg, result

pytestmark = pytest.mark.unit

P = Policy(min_new_messages=4, context_messages=2, idle_timeout_s=100, job_timeout_s=1000,
           retry_backoff_s=5, retry_backoff_max_s=20)
TEXTS = {"fact": "I work at Acme as a nurse", "trivial": "ok thanks", "explicit": "remember this"}
SESSIONS = ["A", "B", "C"]

op = st.one_of(
    st.tuples(st.just("msg"), st.sampled_from(SESSIONS), st.sampled_from(sorted(TEXTS)),
              st.booleans()),
    st.tuples(st.just("end"), st.sampled_from(SESSIONS)),
    st.tuples(st.just("complete"), st.sampled_from(["done", "done", "failed"])),
    st.tuples(st.just("tick"), st.floats(min_value=0, max_value=150)),
)


class World:
    """Drives the machine and records what a real extractor would see."""

    def __init__(self) -> None:
        self.state = UserState("t1", "u1")
        self.now = 0.0
        self.outstanding: dict[str, object] = {}
        self.completed: dict[str, list[tuple[int, int]]] = {s: [] for s in SESSIONS}
        self.accepted = dict.fromkeys(SESSIONS, 0)
        self.ended: set[str] = set()
        self.last_id: dict[str, str] = {}
        self.emitted = []

    def absorb(self, step) -> None:
        for job in step.jobs:
            self.outstanding[job.job_id] = job
            assert len(self.outstanding) <= 1, "two jobs in flight for one user"
            self.emitted.append(job)
        for res in step.resolved:
            assert res.llm_calls == 0
            self.completed[res.session_id].append((res.from_seq, res.to_seq))
        self.state = step.state

    def message(self, session: str, kind: str, dup: bool) -> None:
        if dup and session in self.last_id:
            before = self.state.sessions.get(session)
            step = on_message(self.state, msg(TEXTS[kind], session=session,
                                              mid=self.last_id[session]), self.now, P)
            assert step.duplicate and step.state.sessions.get(session) == before
            return
        m = msg(TEXTS[kind], session=session)
        self.last_id[session] = m.message_id
        self.accepted[session] += 1
        self.absorb(on_message(self.state, m, self.now, P))

    def complete(self, status: str) -> None:
        if not self.outstanding:
            return
        job = self.outstanding.pop(next(iter(self.outstanding)))
        st_ = JobStatus.DONE if status == "done" else JobStatus.FAILED
        if st_ == JobStatus.DONE:
            self.completed[job.session_id].append((job.from_seq, job.to_seq))
        self.absorb(on_result(self.state, result(job, st_, self.now), self.now, P))

    def run(self, ops) -> None:
        for o in ops:
            if o[0] == "msg":
                self.message(o[1], o[2], o[3])
            elif o[0] == "end":
                self.ended.add(o[1])
                self.absorb(on_session_end(self.state, o[1], self.now, P))
            elif o[0] == "complete":
                self.complete(o[1])
            else:
                self.now += o[1]
                self.absorb(on_tick(self.state, self.now, P))

    def drain(self) -> None:
        for s in SESSIONS:
            self.ended.add(s)
            self.absorb(on_session_end(self.state, s, self.now, P))
        for _ in range(2000):
            if self.outstanding:
                self.complete("done")
            elif self.state.sessions:
                self.now += 1000
                self.absorb(on_tick(self.state, self.now, P))
            else:
                return
        raise AssertionError("did not drain")


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=80))
def test_every_message_is_scanned_exactly_once(ops):
    world = World()
    world.run(ops)
    world.drain()
    for session, ranges in world.completed.items():
        covered = sorted(ranges)
        position = 0
        for start, end in covered:
            assert start == position, f"{session}: gap or overlap at {start} (expected {position})"
            assert end > start
            position = end
        assert position == world.accepted[session]
    assert world.state.in_flight is None and not world.state.sessions


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=80))
def test_nothing_below_threshold_without_explicit_end_or_idle(ops):
    world = World()
    world.run(ops)
    for job in world.emitted:
        if job.to_seq - job.from_seq < P.min_new_messages:
            assert job.reason in (TriggerReason.EXPLICIT, TriggerReason.SESSION_END,
                                  TriggerReason.IDLE)
        if job.reason == TriggerReason.THRESHOLD:
            assert job.to_seq - job.from_seq >= P.min_new_messages


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=60))
def test_burst_during_one_job_costs_at_most_one_follow_up(n):
    world = World()
    world.run([("msg", "A", "fact", False)] * 4)
    assert len(world.outstanding) == 1
    world.run([("msg", "A", "fact", False)] * n)
    assert len(world.emitted) == 1
    world.complete("done")
    follow_ups = world.emitted[1:]
    expected = 1 if n >= P.min_new_messages else 0
    assert len(follow_ups) == expected
    if follow_ups:
        assert (follow_ups[0].from_seq, follow_ups[0].to_seq) == (4, 4 + n)
