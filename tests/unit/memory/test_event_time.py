"""Event time wins (SPEC: "a fact from an older message never replaces a newer one,
whatever order Kafka delivers them in"): memory/decisions.py (pure) and the extractor.

A fact's event time is the ``ts`` of the message that states it (the rules model knows it;
an LLM's fact is dated by the job's newest message). A decision that would change a live
version made from newer messages keeps the older fact as history instead (a record of its
own, superseded from the start); a retraction from before the live statement changes
nothing. Within one job, messages are read in event-time order.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memstream.memory.applying import apply_change, change_for
from memstream.memory.decisions import Candidate, Context, Decision, IdMap, resolve
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, RulesModel
from memstream.memory.model import Memory, MemoryType, OpKind, Source, Status
from memstream.memory.outcome import JobOutcome
from memstream.memory.store import Scope
from memstream.memory.store.edge import EdgeStore
from memstream.topics.schemas import ExtractionJob, JobMessage, TriggerReason

pytestmark = pytest.mark.unit
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def live_version(event_ts: float | None) -> Memory:
    return Memory("m-1", "t1", "u1", MemoryType.EPISODIC, "Lives in Madrid", 5, 1.0, 1.0, 50.0,
                  Source("s0", 0, 4, "j0", "op0", (), event_ts), slot="residence")


def ctx(event_ts: float | None) -> Context:
    return Context("t1", "u1", "s1", 0, 4, "j1", 100.0, seq=2, event_ts=event_ts)


def plan(kind: OpKind, event_ts: float | None, theirs: float | None, *, new_fact=True):
    shown, _ = IdMap.number([(live_version(theirs), 0.9)])
    cand = Candidate("Lives in Berlin", slot="residence", new_fact=new_fact)
    return resolve(cand, 0, shown, Decision(kind, 1, "moved"), ctx(event_ts))


def test_an_update_from_older_messages_is_kept_as_history_never_live():
    [op] = plan(OpKind.UPDATE, event_ts=10.0, theirs=20.0)
    assert op.kind == OpKind.ADD and op.before is None and op.memory_id != "m-1"
    past = op.after
    assert past.status == Status.SUPERSEDED and past.content == "Lives in Berlin"
    assert (past.valid_from, past.valid_to) == (10.0, 50.0)  # until the live one began
    assert past.extra["history_of"] == "m-1" and past.source.event_ts == 10.0
    assert "older than the live version" in op.reason


def test_a_retraction_from_before_the_live_statement_changes_nothing():
    assert plan(OpKind.DELETE, event_ts=10.0, theirs=20.0, new_fact=False) == []


def test_a_closed_version_keeps_when_the_closing_statement_was_made():
    [op] = plan(OpKind.DELETE, event_ts=30.0, theirs=20.0, new_fact=False)
    assert (op.after.valid_to, op.after.extra["closed_ts"]) == (100.0, 30.0)  # applied, said
    [op] = plan(OpKind.DELETE, event_ts=None, theirs=20.0, new_fact=False)
    assert "closed_ts" not in op.after.extra


@pytest.mark.parametrize(("mine", "theirs"), [(30.0, 20.0), (20.0, 20.0), (None, 20.0),
                                              (10.0, None), (None, None)])
def test_newer_equal_or_unknown_times_update_as_before(mine, theirs):
    [op] = plan(OpKind.UPDATE, event_ts=mine, theirs=theirs)
    assert op.kind == OpKind.UPDATE and op.memory_id == "m-1"
    closed, opened = op.writes
    assert closed.status == Status.SUPERSEDED and opened.live and opened.version == 2
    assert opened.source.event_ts == mine


# --- through the extractor and the store -------------------------------------------------


def job(job_id: str, texts_at: list[tuple[str, int]], *, start: int = 0, seq: int = 1):
    msgs = [JobMessage(seq=start + i, message_id=f"{job_id}-{i}", role="user", content=t,
                       ts=T0 + timedelta(minutes=m)) for i, (t, m) in enumerate(texts_at)]
    return ExtractionJob(job_id=job_id, seq=seq, tenant_id="t1", user_id="u1",
                         session_id="s1", from_seq=start, to_seq=start + len(msgs),
                         reason=TriggerReason.THRESHOLD, messages=msgs, created_at=T0)


@pytest.fixture
def ex(tmp_path):
    store = EdgeStore(tmp_path / "edge", HashingEmbedder().dim)
    yield Extractor(RulesModel(), HashingEmbedder(), store)
    store.close()


def run(ex: Extractor, j: ExtractionJob, now: float) -> None:
    out = ex.decide(j, now)
    for op, vec in out.ops:
        apply_change(ex.store, change_for(op, vec, j, out, ex.model, now))


def everything(ex: Extractor) -> list[Memory]:
    return ex.store.list(Scope("t1", "u1"), statuses=None)


def test_a_late_job_with_older_messages_never_rolls_the_live_value_back(ex):
    """Producers delivered the session out of order: the move to Madrid (minute 30) is
    decided first, the older move to Berlin (minute 20) after it."""
    run(ex, job("a", [("I live in Lisbon", 0)]), now=100.0)
    run(ex, job("c", [("We moved from Lisbon to Madrid last week.", 30)], start=2, seq=3),
        now=200.0)
    run(ex, job("b", [("We moved from Lisbon to Berlin last week.", 20)], start=1, seq=4),
        now=300.0)
    live = [m.content for m in everything(ex) if m.live]
    assert live == ["Lives in Madrid"]
    late = [m for m in everything(ex) if m.content == "Lives in Berlin"]
    assert len(late) == 1 and late[0].status == Status.SUPERSEDED
    assert late[0].valid_to is not None and late[0].valid_to <= 200.0


def test_a_late_fact_is_dated_by_its_own_message_not_by_a_newer_one_in_its_job(ex):
    """A producer that spreads a session over partitions (re-routed, so later) delivers the
    older move to Berlin (minute 20) in one job with a newer, unrelated message (minute 40),
    after the move to Madrid (minute 30) was applied: the job's newest time must not date
    the Berlin fact."""
    run(ex, job("a", [("I live in Lisbon", 0)]), now=100.0)
    run(ex, job("c", [("We moved from Lisbon to Madrid last week.", 30)], start=2, seq=3),
        now=200.0)
    run(ex, job("b", [("We moved from Lisbon to Berlin last week.", 20),
                      ("I am allergic to penicillin", 40)], start=1, seq=4), now=300.0)
    live = {m.content: m for m in everything(ex) if m.live}
    assert set(live) == {"Lives in Madrid", "Allergic to penicillin"}
    assert live["Allergic to penicillin"].source.event_ts == (T0 + timedelta(minutes=40)
                                                              ).timestamp()
    (late,) = [m for m in everything(ex) if m.content == "Lives in Berlin"]
    assert late.status == Status.SUPERSEDED
    assert late.source.event_ts == (T0 + timedelta(minutes=20)).timestamp()


def test_within_a_job_the_newest_message_wins_whatever_the_arrival_order(ex):
    run(ex, job("a", [("I live in Lisbon", 0)]), now=100.0)
    # arrival (seq) order: Madrid first, then the older Berlin
    run(ex, job("b", [("We moved from Lisbon to Madrid last week.", 30),
                      ("We moved from Lisbon to Berlin last week.", 20)], start=1, seq=2),
        now=200.0)
    assert [m.content for m in everything(ex) if m.live] == ["Lives in Madrid"]


def test_in_order_delivery_is_unchanged(ex):
    run(ex, job("a", [("I live in Lisbon", 0)]), now=100.0)
    run(ex, job("b", [("We moved from Lisbon to Berlin last week.", 20)], start=1, seq=2),
        now=200.0)
    run(ex, job("c", [("We moved from Berlin to Madrid last week.", 30)], start=2, seq=3),
        now=300.0)
    assert [m.content for m in everything(ex) if m.live] == ["Lives in Madrid"]
    assert not [m for m in everything(ex) if "history_of" in m.extra]


def test_a_decision_killed_after_writing_its_history_record_is_completed_not_fenced(ex):
    """The apply stage died after the store took a late fact's history record and before
    the rest (the cursor): applying the decision again completes it and publishes the
    history's event. A history record is never live, which is not a memory moving on."""
    from memstream.memory.applying import apply_decision, build_decision
    from memstream.memory.fencing import Verdict

    run(ex, job("a", [("I live in Lisbon", 0)]), now=100.0)
    run(ex, job("c", [("We moved from Lisbon to Madrid last week.", 30)], start=2, seq=3),
        now=200.0)
    late = job("b", [("We moved from Lisbon to Berlin last week.", 20)], start=1, seq=4)
    decision = build_decision(late, ex.decide(late, 300.0), ex.model, 300.0)
    (history,) = decision.changes
    assert history.after["status"] == "superseded"
    # the crash: the history record reached the store, the cursor did not
    ex.store.write([Memory.from_payload(r) for r in history.records], [history.vector])
    assert ex.store.op_applied(Scope("t1", "u1"), history.change_id)
    applied = apply_decision(ex.store, decision)
    assert applied.verdict == Verdict.APPLY, applied.error
    assert [c.change_id for c in applied.publish] == [history.change_id]
    assert [m.content for m in everything(ex) if m.live] == ["Lives in Madrid"]


# --- restatements ---------------------------------------------------------------------------


def restate(event_ts: float | None, theirs: float | None, restated: float | None = None,
            target: int | None = 1):
    live = live_version(theirs)
    if restated is not None:
        live = live.evolve(extra={"restated_ts": restated})
    shown, _ = IdMap.number([(live, 0.99)])
    cand = Candidate("Lives in Madrid", slot="residence")
    return resolve(cand, 0, shown, Decision(OpKind.NOOP, target, "already known"),
                   ctx(event_ts))


def test_a_newer_restatement_restamps_the_live_version_in_place():
    [op] = restate(event_ts=30.0, theirs=20.0)
    assert (op.kind, op.memory_id, op.before.version, op.after.version) == (
        OpKind.RESTATE, "m-1", 1, 1)
    assert op.writes == (op.after,) and op.after.live
    assert op.after.extra == {"restated_ts": 30.0, "restated_by": op.op_id}
    assert op.after.source == op.before.source  # its lineage stays the statement that made it
    assert op.after.stated_ts == 30.0


@pytest.mark.parametrize(("mine", "theirs", "restated", "target"), [
    (20.0, 20.0, None, 1),  # as old as the statement that made it
    (10.0, 20.0, None, 1),  # older
    (25.0, 20.0, 30.0, 1),  # older than an earlier restatement
    (None, 20.0, None, 1),  # undated (a tool write)
    (30.0, 20.0, None, None),  # a NOOP naming no memory
    (30.0, 20.0, None, 7),  # naming one it was not shown
])
def test_other_noops_change_nothing(mine, theirs, restated, target):
    assert restate(mine, theirs, restated, target) == []


def test_a_late_fact_older_than_a_restatement_is_history(ex):
    """Lisbon said at minute 0 and again at 30; a move to Madrid written at 20 arrives
    last: the newest statement (Lisbon, 30) stays live, the move is history."""
    run(ex, job("a", [("I live in Lisbon", 0)]), now=100.0)
    run(ex, job("b", [("I live in Lisbon", 30)], start=1, seq=2), now=200.0)
    run(ex, job("c", [("We moved from Lisbon to Madrid last week.", 20)], start=2, seq=3),
        now=300.0)
    [live] = [m for m in everything(ex) if m.live]
    assert (live.content, live.version) == ("Lives in Lisbon", 1)
    assert live.stated_ts == (T0 + timedelta(minutes=30)).timestamp()
    [late] = [m for m in everything(ex) if m.content == "Lives in Madrid"]
    assert late.status == Status.SUPERSEDED and late.extra["history_of"] == live.memory_id


def test_a_restatement_in_the_job_that_made_the_version_is_folded_into_it(ex):
    """One record per version and job: the job's ADD carries the later statement's time,
    with no second op that a replay could apply in the wrong order."""
    j = job("a", [("I live in Lisbon", 0), ("I live in Lisbon", 5),
                  ("We moved from Lisbon to Madrid last week.", 9)])
    out = ex.decide(j, 100.0)
    kinds = [op.kind for op, _ in out.ops]
    assert kinds == [OpKind.ADD, OpKind.UPDATE]
    added, update = out.ops[0][0], out.ops[1][0]
    assert added.after.extra["restated_ts"] == (T0 + timedelta(minutes=5)).timestamp()
    assert update.before == added.after


def test_a_replayed_restatement_is_applied_once_and_never_undoes_a_later_close(ex, tmp_path):
    run(ex, job("a", [("I live in Lisbon", 0)]), now=100.0)
    j = job("b", [("I live in Lisbon", 30), ("We moved from Lisbon to Madrid last week.", 40)],
            start=1, seq=2)
    out = ex.decide(j, 200.0)
    changes = [change_for(op, vec, j, out, ex.model, 200.0) for op, vec in out.ops]
    assert [c.op for c in changes] == ["restate", "update"]
    for c in changes:
        apply_change(ex.store, c)
    assert [apply_change(ex.store, c) for c in changes] == [False, False]  # seen before
    assert [m.content for m in everything(ex) if m.live] == ["Lives in Madrid"]


def test_a_version_records_the_seq_of_the_job_that_opened_it():
    """The apply stage tells a half-applied decision's versions (above the store's cursor)
    from applied ones by it. It is one of the marks a change stamps on the version it opens
    (``extra``: a worker of an earlier release reads the record as before); the version it
    closes keeps its own, and a record without it reads as 0."""
    job = ExtractionJob(job_id="j1", seq=7, tenant_id="t1", user_id="u1", session_id="s1",
                        from_seq=0, to_seq=1, reason=TriggerReason.THRESHOLD, messages=[],
                        created_at=T0)
    older = live_version(50.0).evolve(extra={"job_seq": 3})
    [op] = plan(OpKind.UPDATE, 60.0, 50.0)
    change = change_for(op, [0.0] * 4, job, JobOutcome(), RulesModel(), 100.0)
    opened = [Memory.from_payload(r) for r in change.records
              if r["source"]["op_id"] == op.op_id]
    closed = [Memory.from_payload(r) for r in change.records
              if r["source"]["op_id"] != op.op_id]
    assert [m.job_seq for m in opened] == [7] and all(m.job_seq == 0 for m in closed)
    assert older.job_seq == 3 and live_version(None).job_seq == 0
