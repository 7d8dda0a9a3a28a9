"""Corrections (memory.governance): delete, rollback, undo a job — planned purely, then
applied through the real decide -> apply path on both store backends, and replayed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memstream.memory import governance
from memstream.memory.applying import apply_change, apply_decision, build_decision
from memstream.memory.decisions import Context
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import JobOutcome, RulesModel
from memstream.memory.model import Memory, OpKind, Status
from memstream.memory.plan import Plan
from memstream.memory.store import Scope
from memstream.topics.schemas import ExtractionJob, JobStatus, ToolWrite, TriggerReason
from tests.unit.builders import make_store, memory

pytestmark = pytest.mark.unit

EMB = HashingEmbedder()


@pytest.fixture(params=["edge", "server"])
def store(request, tmp_path):
    s = make_store(request.param, tmp_path, EMB.dim)
    yield s
    s.close()


def ctx(seq: int, now: float = 100.0, job: str | None = None) -> Context:
    return Context("t1", "u1", "tool", 0, 0, job or f"job-{seq}", now, seq=seq)


def apply(store, plan: Plan, seq: int, now: float = 100.0, job: str | None = None,
          name: str = "delete"):
    """Apply ``plan`` as the job ``job`` (default ``job-<seq>``); the published changes."""
    j = ExtractionJob(job_id=job or f"job-{seq}", seq=seq, tenant_id="t1", user_id="u1",
                      session_id="tool", from_seq=0, to_seq=0, reason=TriggerReason.TOOL,
                      messages=[], created_at=datetime.fromtimestamp(now, UTC),
                      tool=ToolWrite(name=name, principal="key-1"))  # type: ignore[arg-type]
    out = JobOutcome(ops=[(op, None if op.kind == OpKind.DELETE else
                           EMB.embed([op.after.content])[0]) for op in plan.ops],
                     read=dict(plan.read))
    applied = apply_decision(store, build_decision(j, out, RulesModel(), now))
    assert applied.status == JobStatus.DONE and applied.error is None
    return applied.publish


def everything(store) -> list[Memory]:
    return store.list(Scope("t1", "u1"), statuses=None)


def live_texts(store) -> dict[str, str]:
    return {m.memory_id: m.content for m in store.list(Scope("t1", "u1"))}


def seed(store, *rows: tuple[str, str]) -> None:
    ms = [memory(text, mid=mid) for mid, text in rows]
    store.write(ms, EMB.embed([m.content for m in ms]))


def test_delete_one_then_all_and_never_another_user(store):
    seed(store, ("a", "Lives in Lisbon"), ("b", "Has two kids"))
    other = memory("Lives in Oslo", mid="x", user="u2")
    store.write([other], EMB.embed([other.content]))
    out = governance.plan_delete(everything(store), ["a", "nope", "x"], ctx(1))
    assert out.refused == ["nope: no live memory with this id",
                           "x: no live memory with this id"]  # u2's memory is not u1's
    changes = apply(store, out.plan, 1)
    assert [(c.op, c.memory_id) for c in changes] == [("delete", "a")]
    closed = changes[0].records[0]
    assert closed["status"] == "deleted" and closed["extra"]["closed_kind"] == "deletion"
    assert closed["extra"]["closed_actor"] == "key-1"
    assert live_texts(store) == {"b": "Has two kids"}
    apply(store, governance.plan_delete(everything(store), None, ctx(2)).plan, 2)
    assert live_texts(store) == {}
    assert [m.content for m in store.list(Scope("t1", "u2"))] == ["Lives in Oslo"]


def update(store, mid: str, text: str, seq: int):
    """An UPDATE of ``mid`` to ``text`` by job ``job-<seq>`` (as an extraction would)."""
    [live] = [m for m in store.list(Scope("t1", "u1")) if m.memory_id == mid]
    c = ctx(seq)
    target = live.evolve(content=text)
    governance_plan = Plan()
    governance._become(governance_plan, c, [live], target, "moved")
    return apply(store, governance_plan, seq, name="rollback")


def test_rollback_makes_the_old_content_a_new_version(store):
    seed(store, ("a", "Lives in Lisbon"))
    update(store, "a", "Lives in Porto", 1)
    out = governance.plan_rollback(everything(store), "a", 1, ctx(2))
    changes = apply(store, out.plan, 2)
    assert [(c.op, c.version, c.after["content"]) for c in changes] == [
        ("update", 3, "Lives in Lisbon")]
    assert changes[0].reason == "rollback to version 1"
    versions = sorted((m.version, m.status.value, m.content) for m in everything(store))
    assert versions == [(1, "superseded", "Lives in Lisbon"), (2, "superseded", "Lives in Porto"),
                        (3, "active", "Lives in Lisbon")]
    assert governance.plan_rollback(everything(store), "a", 3, ctx(3)).refused == [
        "a: version 3 is the live one already"]
    assert governance.plan_rollback(everything(store), "a", 9, ctx(3)).refused == [
        "a: no version 9"]


def test_rollback_of_a_deleted_memory_restores_it(store):
    seed(store, ("a", "Lives in Lisbon"))
    apply(store, governance.plan_delete(everything(store), ["a"], ctx(1)).plan, 1)
    changes = apply(store, governance.plan_rollback(everything(store), "a", 1, ctx(2)).plan, 2)
    assert [(c.op, c.before, c.version) for c in changes] == [("add", None, 2)]
    assert live_texts(store) == {"a": "Lives in Lisbon"}
    restored = next(m for m in everything(store) if m.version == 2)
    assert "closed_job" not in restored.extra and "closed_reason" not in restored.extra


def test_undo_of_a_rollback_that_restored_a_deleted_memory_deletes_it_again(store):
    seed(store, ("a", "Lives in Lisbon"))
    apply(store, governance.plan_delete(everything(store), ["a"], ctx(1)).plan, 1)
    apply(store, governance.plan_rollback(everything(store), "a", 1, ctx(2)).plan, 2)
    assert live_texts(store) == {"a": "Lives in Lisbon"}
    out = governance.plan_undo_job(everything(store), "job-2", ctx(3))
    assert out.refused == []
    apply(store, out.plan, 3, name="undo_job")
    assert live_texts(store) == {}


def test_undo_a_job_reverses_its_adds_updates_and_deletes(store):
    seed(store, ("a", "Lives in Lisbon"), ("b", "Has two kids"), ("c", "Likes tea"))
    # job-1 "pours garbage in": updates a, deletes b, adds d
    plan = Plan()
    c1 = ctx(1)
    live = {m.memory_id: m for m in store.list(Scope("t1", "u1"))}
    governance._become(plan, c1, [live["a"]], live["a"].evolve(content="Lives on Mars"), "x")
    governance._close(plan, c1, live["b"], "x")
    d = memory("Owns a dragon", mid="d")
    plan.add(governance.PlannedOp("op-d", OpKind.ADD, "d", None,
                                  d.evolve(source=c1.source("op-d")),
                                  (d.evolve(source=c1.source("op-d")),), "x"), None)
    apply(store, plan, 1)
    assert live_texts(store) == {"a": "Lives on Mars", "c": "Likes tea", "d": "Owns a dragon"}
    out = governance.plan_undo_job(everything(store), "job-1", ctx(2))
    assert out.refused == []
    apply(store, out.plan, 2, name="undo_job")
    assert live_texts(store) == {"a": "Lives in Lisbon", "b": "Has two kids", "c": "Likes tea"}
    # undoing again changes nothing: every memory moved on since job-1
    again = governance.plan_undo_job(everything(store), "job-1", ctx(3))
    assert again.plan.ops == [] and len(again.refused) == 3


def test_undo_leaves_a_memory_changed_since_alone(store):
    seed(store, ("a", "Lives in Lisbon"))
    update(store, "a", "Lives in Porto", 1)
    update(store, "a", "Lives in Faro", 2)
    out = governance.plan_undo_job(everything(store), "job-1", ctx(3))
    assert out.plan.ops == [] and out.refused == ["a: changed again after job job-1"]


def test_the_change_log_replays_corrections_into_the_same_store(store, tmp_path):
    seed(store, ("a", "Lives in Lisbon"), ("b", "Has two kids"))
    seeded = everything(store)
    log = update(store, "a", "Lives in Porto", 1)
    log += apply(store, governance.plan_delete(everything(store), ["b"], ctx(2)).plan, 2)
    log += apply(store, governance.plan_rollback(everything(store), "a", 1, ctx(3)).plan, 3)
    log += apply(store, governance.plan_undo_job(everything(store), "job-2", ctx(4)).plan, 4,
                 name="undo_job")
    assert live_texts(store) == {"a": "Lives in Lisbon", "b": "Has two kids"}
    replica = make_store("server", tmp_path, EMB.dim)
    replica.write(seeded, EMB.embed([m.content for m in seeded]))
    for change in log:
        assert apply_change(replica, change)
    def versions(s):
        return sorted((m.memory_id, m.version, m.status.value, m.content) for m in everything(s))
    assert versions(replica) == versions(store)
    replica.close()


def test_undo_of_a_merge_or_an_archive_restores_what_the_job_closed(store):
    from memstream.memory import plan as maintenance

    seed(store, ("a", "Likes tea"), ("b", "Likes green tea"), ("c", "Owns a bike"))
    live = {m.memory_id: m for m in store.list(Scope("t1", "u1"))}
    plan, c1 = Plan(), ctx(1, job="consolidate-1")
    governance._become(plan, c1, [live["a"]], live["a"].evolve(content="Likes tea, green"),
                       "merged")
    maintenance.close(plan, c1, live["b"], Status.SUPERSEDED, 100.0, 100.0,
                       "merged into a", "merged")
    maintenance.close(plan, c1, live["c"], Status.ARCHIVED, 100.0, 100.0,
                       "idle", "archived")
    apply(store, plan, 1, job="consolidate-1", name="rollback")
    assert live_texts(store) == {"a": "Likes tea, green"}
    out = governance.plan_undo_job(everything(store), "consolidate-1", ctx(2))
    assert out.refused == []
    apply(store, out.plan, 2, name="undo_job")
    assert live_texts(store) == {"a": "Likes tea", "b": "Likes green tea", "c": "Owns a bike"}
