"""When the windowed jobs run (jobs.triggers, streams.jobs_fold.DueIndex): pure, time injected."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memstream.jobs.triggers import JobsPolicy, UserJobs, next_due, on_change, on_tick
from memstream.streams.jobs_fold import DueIndex
from memstream.topics.schemas import Lineage, MemoryChange

pytestmark = pytest.mark.unit

P = JobsPolicy(reflection_threshold=20, consolidation_interval_s=100.0, decay_interval_s=1000.0)
DAY = 86_400.0


def change(importance: int, *, op: str = "add", kind: str = "extraction",
           extra: dict | None = None, n: int = 0, status: str = "active") -> MemoryChange:
    after = {"content": f"fact {n}", "importance": importance, "extra": extra or {},
             "status": status}
    return MemoryChange(
        change_id=f"c{n}", op=op, tenant_id="t1", user_id="u1", memory_id=f"m{n}", version=1,
        before=None, after=after, records=[], lineage=Lineage(
            session_id="s", from_seq=0, to_seq=1, job_id="j", kind=kind),
        model="rules", prompt_version="rules-1", decided_at=datetime(2026, 1, 1, tzinfo=UTC))


def feed(state: UserJobs, importances: list[int], now: float = 0.0, **kw) -> tuple:
    sent = []
    for n, imp in enumerate(importances):
        state, commands = on_change(state, change(imp, n=n, **kw), now, P)
        sent += commands
    return state, sent


def test_reflection_fires_exactly_when_the_sum_reaches_the_threshold():
    state, sent = feed(UserJobs("t1", "u1"), [7, 7, 5])  # 19: not yet
    assert sent == [] and state.importance_sum == 19
    state, sent = feed(state, [1])  # 20: now, and the sum starts again
    assert [c.request_id for c in sent] == ["reflect-1"] and state.importance_sum == 0
    state, sent = feed(state, [9, 9, 9])
    assert [c.request_id for c in sent] == ["reflect-2"] and state.importance_sum == 0


def test_reflections_deletions_and_the_jobs_own_changes_never_count():
    state = UserJobs("t1", "u1")
    for kw in ({"extra": {"kind": "reflection"}, "kind": "reflection"},
               {"op": "delete"}, {"kind": "consolidation"}, {"kind": "decay"},
               {"status": "superseded"}):  # a late fact kept as history (event time)
        state, sent = feed(state, [10, 10, 10], **kw)
        assert sent == [] and state.importance_sum == 0, kw


def test_no_memory_no_reflection_so_trivial_turns_never_reflect():
    # Twenty "ok"s resolve as trivial jobs: they write no memory, so no change reaches here.
    state, sent = feed(UserJobs("t1", "u1"), [])
    assert sent == [] and next_due(state) is None


def test_consolidation_is_due_an_interval_after_new_memories_and_only_then():
    state, _ = feed(UserJobs("t1", "u1"), [3], now=50.0)
    assert on_tick(state, 149.0, P)[1] == []
    state, sent = on_tick(state, 150.0, P)
    assert [c.kind for c in sent] == ["consolidate"] and state.next_consolidation is None
    state, sent = on_tick(state, 10_000.0 - 1, P)  # nothing new since: no second pass
    assert "consolidate" not in [c.kind for c in sent]
    state, _ = feed(state, [3], now=20_000.0)
    assert [c.request_id for c in on_tick(state, 20_100.0, P)[1] if c.kind == "consolidate"] == [
        "consolidate-2"]


def test_decay_sweeps_every_interval_once_a_user_has_memories():
    state, _ = feed(UserJobs("t1", "u1"), [3], now=0.0)
    state, sent = on_tick(state, 1000.0, P)
    assert "decay-1" in [c.request_id for c in sent] and state.next_decay == 2000.0
    state, sent = on_tick(state, 1500.0, P)
    assert [c for c in sent if c.kind == "decay"] == []


def test_disabled_jobs_send_nothing():
    policy = JobsPolicy(reflection_threshold=1, consolidation_interval_s=1, decay_interval_s=1,
                        enabled=("decay",))
    state, sent = on_change(UserJobs("t1", "u1"), change(5), 0.0, policy)
    assert sent == []
    assert [c.kind for c in on_tick(state, 10.0, policy)[1]] == ["decay"]


def test_state_survives_a_snapshot():
    state, _ = feed(UserJobs("t1", "u1"), [3, 4], now=7.0)
    assert UserJobs.restore(state.snapshot()) == state


def test_the_due_index_names_only_due_users_once():
    index = DueIndex()
    index.push(b"t/a", 10.0)
    index.push(b"t/b", 20.0)
    index.push(b"t/a", 30.0)  # moved later: the old entry is stale
    assert index.pop_due(25.0) == [b"t/b"]
    assert index.pop_due(25.0) == []
    assert index.pop_due(30.0) == [b"t/a"] and len(index) == 0
    index.push(b"t/c", 5.0)
    index.push(b"t/c", None)  # nothing due any more
    assert index.pop_due(100.0) == []


def test_jobs_run_builds_a_triggers_only_worker(tmp_path):
    from memstream.cli import jobs_only
    from memstream.core.settings import Settings
    from memstream.streams.app import build_app

    base = Settings(data_dir=tmp_path, embedder="hashing", web_enabled=True)
    own = jobs_only(base, ("decay",))
    assert (own.app_id, own.jobs, own.ingest_enabled, own.extract_enabled, own.web_enabled) == (
        "memstream-jobs", ("decay",), False, False, False)
    p = build_app(own)
    assert not p.app.agents  # no Faust agent: one owned loop
    loops = [(loop.group, loop.stage.inputs) for loop in p.loops]
    assert loops == [("memstream-jobs-jobs", [p.topics.memory_changes.name])]


def test_the_worker_runs_its_stages_in_owned_loops(tmp_path):
    from memstream.core.settings import Settings
    from memstream.streams.app import build_app

    p = build_app(Settings(data_dir=tmp_path, embedder="hashing", web_enabled=False))
    loops = {loop.group: loop.stage.inputs for loop in p.loops}
    t = p.topics
    assert loops == {
        "memstream-ingest": [x.name for x in t.ingest_inputs()],
        "memstream-extract": [t.jobs.name],
        "memstream-apply": [t.decisions.name],
        "memstream-access": [t.memory_access.name]}
    agents = {a.name.rsplit(".", 1)[-1] for a in p.app.agents.values()}
    assert not agents & {"extract", "apply", "jobs", "ingest"}
