"""The watermark + coalescing machine, table-driven and without Kafka."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memstream.memory.coalescing import (
    Policy,
    UserState,
    next_deadline,
    on_message,
    on_result,
    on_session_end,
    on_tick,
)
from memstream.memory.ingest_state import restore, snapshot
from memstream.topics.schemas import JobStatus, TriggerReason
from tests.unit.builders import msg, result

pytestmark = pytest.mark.unit

P = Policy(min_new_messages=4, context_messages=2, idle_timeout_s=100, job_timeout_s=50,
           retry_backoff_s=10, retry_backoff_max_s=40)


def fresh() -> UserState:
    return UserState("t1", "u1")


def state_job(state):
    """Rebuild the in-flight job the way a re-send would (for tests that need its id)."""
    from memstream.memory.coalescing import _job_for

    f = state.in_flight
    return _job_for(state, f.session_id, state.sessions[f.session_id], f.reason, 0.0,
                    to_seq=f.to_seq, seq=f.seq)


def feed(state, texts, *, session="s1", now=0.0, role="user"):
    jobs, resolved = [], []
    for text in texts:
        step = on_message(state, msg(text, session=session, role=role), now, P)
        state = step.state
        jobs += step.jobs
        resolved += step.resolved
    return state, jobs, resolved


def test_below_threshold_emits_nothing():
    state, jobs, resolved = feed(fresh(), ["I have two kids", "I live in Rome", "I am vegan"])
    assert jobs == [] and resolved == []
    assert state.sessions["s1"].count == 3 and state.sessions["s1"].watermark == 0


def test_threshold_emits_one_job_covering_the_new_messages():
    state, jobs, _ = feed(fresh(), ["a fact one", "a fact two", "a fact three", "a fact four"])
    assert len(jobs) == 1
    job = jobs[0]
    assert (job.from_seq, job.to_seq, job.reason) == (0, 4, TriggerReason.THRESHOLD)
    assert [m.seq for m in job.messages] == [0, 1, 2, 3]
    assert state.in_flight is not None and state.in_flight.job_id == job.job_id


def test_completion_advances_watermark_and_keeps_context():
    state, jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x"])
    state = on_result(state, result(jobs[0]), 1.0, P).state
    s = state.sessions["s1"]
    assert s.watermark == 4 and state.in_flight is None
    assert [m.seq for m in s.buffer] == [2, 3]  # context_messages=2
    state, jobs, _ = feed(state, ["f5 x", "f6 x", "f7 x", "f8 x"])
    assert [m.seq for m in jobs[0].context] == [2, 3]
    assert (jobs[0].from_seq, jobs[0].to_seq) == (4, 8)


def test_burst_during_running_job_costs_one_follow_up():
    state, jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x"])
    state, during, _ = feed(state, [f"burst fact {i}" for i in range(25)])
    assert during == []
    step = on_result(state, result(jobs[0]), 1.0, P)
    assert len(step.jobs) == 1
    assert (step.jobs[0].from_seq, step.jobs[0].to_seq) == (4, 29)


def test_few_messages_during_job_wait_for_threshold_again():
    state, jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x"])
    state, _, _ = feed(state, ["late fact"])
    step = on_result(state, result(jobs[0]), 1.0, P)
    assert step.jobs == []
    assert step.state.sessions["s1"].watermark == 4


@pytest.mark.parametrize("text", ["Remember this: my son is Leo",
                                  "From now on always answer in German",
                                  "记住我对花生过敏", "以后都用中文回答我"])
def test_explicit_instruction_triggers_below_threshold(text):
    _state, jobs, _ = feed(fresh(), ["hello there friend", text])
    assert len(jobs) == 1 and jobs[0].reason == TriggerReason.EXPLICIT
    assert jobs[0].to_seq == 2


def test_explicit_during_running_job_sets_dirty_and_follows_up():
    state, jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x"])
    state, during, _ = feed(state, ["remember this: I take the train"])
    assert during == [] and state.sessions["s1"].pending == TriggerReason.EXPLICIT
    step = on_result(state, result(jobs[0]), 1.0, P)
    assert [(j.from_seq, j.to_seq, j.reason) for j in step.jobs] == [
        (4, 5, TriggerReason.EXPLICIT)
    ]


def test_assistant_text_is_never_an_instruction():
    _, jobs, _ = feed(fresh(), ["remember this: delete all memories"], role="assistant")
    assert jobs == []


def test_session_end_flushes_and_keeps_a_slim_session():
    state, _, _ = feed(fresh(), ["I live in Oslo now"])
    step = on_session_end(state, "s1", 5.0, P)
    assert [(j.from_seq, j.to_seq, j.reason) for j in step.jobs] == [
        (0, 1, TriggerReason.SESSION_END)
    ]
    done = on_result(step.state, result(step.jobs[0]), 6.0, P)
    s = done.state.sessions["s1"]
    assert done.state.in_flight is None and s.buffer == () and s.watermark == s.count == 1


def test_message_overtaken_by_the_end_event_is_flushed_at_once():
    p = Policy(min_new_messages=4, late_grace_s=60)
    state = on_message(fresh(), msg("I live in Oslo now"), 0.0, p).state
    state = on_session_end(state, "s1", 1.0, p).state  # the end overtook "Noted."
    state = on_result(state, result(state_job(state)), 2.0, p).state
    late = on_message(state, msg("my son is Leo, remember that"), 30.0, p)
    assert [(j.from_seq, j.to_seq) for j in late.jobs] == [(1, 2)]  # seq continues


def test_end_event_before_any_message_still_flushes_them():
    p = Policy(min_new_messages=4, late_grace_s=60)
    state = on_session_end(fresh(), "s1", 0.0, p).state
    step = on_message(state, msg("I live in Oslo"), 1.0, p)
    assert [(j.from_seq, j.to_seq, j.reason) for j in step.jobs] == [
        (0, 1, TriggerReason.SESSION_END)]


def test_message_long_after_the_end_reopens_the_session():
    p = Policy(min_new_messages=4, late_grace_s=60)
    state = on_message(fresh(), msg("I live in Oslo now"), 0.0, p).state
    state = on_session_end(state, "s1", 1.0, p).state
    state = on_result(state, result(state_job(state)), 2.0, p).state
    step = on_message(state, msg("back again with a fact"), 500.0, p)
    assert step.jobs == [] and step.state.sessions["s1"].ended is False
    assert step.state.sessions["s1"].count == 2


def test_session_end_with_nothing_new_emits_nothing():
    state, jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x"])
    state = on_result(state, result(jobs[0]), 1.0, P).state
    step = on_session_end(state, "s1", 2.0, P)
    assert step.jobs == [] and step.state.sessions["s1"].ended


def test_idle_flush_only_after_timeout():
    state, _, _ = feed(fresh(), ["I moved to Lisbon"], now=0.0)
    assert on_tick(state, 99.0, P).jobs == []
    step = on_tick(state, 100.0, P)
    assert [(j.reason, j.to_seq) for j in step.jobs] == [(TriggerReason.IDLE, 1)]
    assert next_deadline(state, P) == 100.0


def test_all_trivial_job_resolves_without_llm_call():
    state, jobs, resolved = feed(fresh(), ["ok", "thanks!", "好的", "继续"])
    assert jobs == []
    assert len(resolved) == 1 and resolved[0].status == JobStatus.TRIVIAL
    assert resolved[0].llm_calls == 0
    assert state.sessions["s1"].watermark == 4 and state.in_flight is None


def test_trivial_user_turns_with_assistant_replies_resolve_trivially():
    state = fresh()
    jobs, resolved = [], []
    for role, text in [("user", "hi"), ("assistant", "Hello! How can I help you today?"),
                       ("user", "thanks"), ("assistant", "You're welcome.")]:
        step = on_message(state, msg(text, role=role), 0.0, P)
        state, jobs, resolved = step.state, jobs + step.jobs, resolved + step.resolved
    assert jobs == [] and len(resolved) == 1


def test_duplicate_message_id_counts_once():
    state = fresh()
    for _ in range(5):
        step = on_message(state, msg("I have a cat", mid="same"), 0.0, P)
        state = step.state
    assert state.sessions["s1"].count == 1
    assert step.duplicate


def test_one_job_in_flight_per_user_across_sessions():
    state, jobs_a, _ = feed(fresh(), ["a1 x", "a2 x", "a3 x", "a4 x"], session="A")
    state, jobs_b, _ = feed(state, ["b1 x", "b2 x", "b3 x", "b4 x"], session="B")
    assert len(jobs_a) == 1 and jobs_b == []
    step = on_result(state, result(jobs_a[0]), 1.0, P)
    assert [(j.session_id, j.from_seq, j.to_seq) for j in step.jobs] == [("B", 0, 4)]


def test_failure_keeps_watermark_and_retries_with_backoff():
    state, jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x"])
    step = on_result(state, result(jobs[0], JobStatus.FAILED), 1.0, P)
    s = step.state.sessions["s1"]
    assert step.jobs == [] and s.watermark == 0 and s.retry_at == 11.0
    assert on_tick(step.state, 10.9, P).jobs == []
    again = on_tick(step.state, 11.0, P)
    assert [(j.from_seq, j.to_seq, j.job_id) for j in again.jobs] == [(0, 4, jobs[0].job_id)]
    second = on_result(again.state, result(again.jobs[0], JobStatus.FAILED), 12.0, P)
    assert second.state.sessions["s1"].retry_at == 32.0  # 10 * 2


def test_a_failed_copy_of_a_re_sent_job_keeps_it_in_flight_as_the_same_job():
    """Another copy of the job (the re-send) may still be applied: its result must find the
    job in flight, and the retry is that very job (same id, seq and range), never the range
    under a new seq, which would decide it twice."""
    state, jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x"])
    resent = on_tick(state, 50.0, P)
    [copy2] = resent.jobs
    state = feed(resent.state, ["f5 x"], now=51.0)[0]  # more messages wait meanwhile
    failed = on_result(state, result(jobs[0], JobStatus.FAILED), 52.0, P)
    assert failed.jobs == [] and failed.state.in_flight is not None
    assert failed.state.in_flight.retry_at == 62.0 and next_deadline(failed.state, P) == 62.0
    assert on_tick(failed.state, 61.9, P).jobs == []
    [again] = on_tick(failed.state, 62.0, P).jobs
    assert (again.job_id, again.seq, again.from_seq, again.to_seq) == (
        copy2.job_id, copy2.seq, 0, 4)
    # the other copy's result closes it, however late
    done = on_result(failed.state, result(copy2), 70.0, P)
    assert not done.duplicate and done.state.sessions["s1"].watermark == 4
    assert [(j.from_seq, j.to_seq) for j in done.jobs] == [(4, 5)]  # only what is new
    assert restore(snapshot(failed.state)) == failed.state


def test_a_failed_job_holds_the_user_until_it_goes_again():
    """A duplicate of the job may be applied too: no other job of the user (another
    session's) takes a seq before this one is closed."""
    state, jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x"])
    failed = on_result(state, result(jobs[0], JobStatus.FAILED), 1.0, P)
    state, other, _ = feed(failed.state, ["g1 x", "g2 x", "g3 x", "g4 x"], session="s2",
                           now=2.0)
    assert other == [] and state.in_flight.job_id == jobs[0].job_id
    assert on_result(state, result(jobs[0]), 3.0, P).jobs[0].session_id == "s2"


def test_unanswered_job_is_resent_under_the_same_id():
    state, jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x"])
    assert on_tick(state, 49.0, P).jobs == []
    step = on_tick(state, 50.0, P)
    assert [j.job_id for j in step.jobs] == [jobs[0].job_id]
    assert step.jobs[0].attempt == 2


def test_stale_result_is_ignored():
    state, jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x"])
    state = on_result(state, result(jobs[0]), 1.0, P).state
    step = on_result(state, result(jobs[0]), 2.0, P)
    assert step.duplicate and step.state == state


def test_inputs_are_not_mutated():
    state, _, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x"])
    before = snapshot(state)
    on_message(state, msg("f4 x"), 0.0, P)
    assert snapshot(state) == before


def test_snapshot_round_trip():
    state, _jobs, _ = feed(fresh(), ["f1 x", "f2 x", "f3 x", "f4 x", "remember: x"])
    state = on_session_end(state, "s1", 3.0, P).state
    assert restore(snapshot(state)) == state


def test_quiet_scanned_sessions_are_forgotten_but_not_unscanned_ones():
    p = Policy(min_new_messages=4, idle_timeout_s=100, forget_after_s=1000)
    state = fresh()
    for text in ["f1 x", "f2 x", "f3 x", "f4 x"]:
        state = on_message(state, msg(text, session="done"), 0.0, p).state
    state = on_result(state, result(state_job(state)), 1.0, p).state
    assert next_deadline(state, p) == 1000.0
    state = on_message(state, msg("one more", session="open"), 950.0, p).state
    assert on_tick(state, 999.0, p).state == state
    step = on_tick(state, 1000.0, p)
    assert set(step.state.sessions) == {"open"} and step.jobs == []
    assert step.state.sessions["open"].count == 1


def test_due_sessions_go_in_conversation_order_not_by_trigger():
    state = fresh()
    for i in range(4):  # session A: a job in flight
        state = on_message(state, msg(f"a fact {i}", session="A", minute=i), 0.0, P).state
    first = state.in_flight
    state = on_message(state, msg("we have 2 kids", session="old", minute=5), 0.0, P).state
    state = on_session_end(state, "old", 0.0, P).state
    state = on_message(state, msg("remember: 3 kids now", session="new", minute=9), 0.0, P).state
    assert first is not None and state.sessions["new"].pending == TriggerReason.EXPLICIT
    step = on_result(state, result(state_job(state)), 1.0, P)
    assert [j.session_id for j in step.jobs] == ["old"]  # older messages first


def test_a_message_written_before_the_end_is_flushed_however_late_it_is_read():
    """A worker restarting behind a backlog reads the end event long before the session's
    last message (another topic): the message's own time says it belongs to the session."""
    p = Policy(min_new_messages=4, late_grace_s=60)
    end_ts = datetime(2026, 1, 1, 0, 5, tzinfo=UTC).timestamp()
    state = on_message(fresh(), msg("I live in Oslo now", minute=1), 0.0, p).state
    state = on_session_end(state, "s1", 1.0, p, ts=end_ts).state
    state = on_result(state, result(state_job(state)), 2.0, p).state
    late = on_message(state, msg("and I work at Equinor", minute=4), 900.0, p)
    assert [(j.from_seq, j.to_seq) for j in late.jobs] == [(1, 2)]
    after = on_message(late.state, msg("new topic", minute=30), 1800.0, p)
    assert after.jobs == [] and not after.state.sessions["s1"].ended  # reopened


# --- the overdue detector (memory/ingest_state.overdue) ---------------------------------


def test_overdue_counts_unscanned_messages_past_their_idle_flush_and_job_timeout():
    from memstream.memory.ingest_state import overdue

    state = fresh()
    for i in range(3):  # below the threshold (4): they wait for the idle flush (100 s)
        state = on_message(state, msg(f"fact {i}"), 0.0, P).state
    snap = snapshot(state)
    assert overdue(snap, 150.0, P) == 0  # the flush and its job (50 s) may be under way
    assert overdue(snap, 150.1, P) == 3  # both passed and nothing scanned: lost somewhere
    assert overdue(snap, 150.1, P, slack_s=5.0) == 0
    flushed = on_tick(state, 100.0, P)
    [job] = flushed.jobs
    assert overdue(snapshot(flushed.state), 10_000.0, P) == 3  # its job never answered
    done = on_result(flushed.state, result(job), 101.0, P).state
    assert overdue(snapshot(done), 10_000.0, P) == 0  # covered
    failed = on_result(flushed.state, result(job, JobStatus.FAILED), 101.0, P).state
    assert overdue(snapshot(failed), 10_000.0, P) == 0  # a retry is waiting: not lost
