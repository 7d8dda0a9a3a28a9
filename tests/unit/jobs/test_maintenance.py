"""The windowed jobs' planners (jobs.decay, jobs.consolidation, jobs.reflection: offline
reflection) with an injected clock, and their plans applied through the real decide -> apply
path."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memstream.jobs.consolidation import plan_consolidation
from memstream.jobs.decay import DAY, DecayPolicy, plan_decay
from memstream.jobs.reflection import profile_reflection
from memstream.memory import rules
from memstream.memory.applying import apply_decision, build_decision
from memstream.memory.decisions import Context, op_id
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import JobOutcome, RulesModel
from memstream.memory.model import Memory, OpKind, Status
from memstream.memory.plan import REFLECTION, Plan, is_reflection
from memstream.memory.store import Scope
from memstream.topics.schemas import ExtractionJob, JobStatus, TriggerReason
from tests.unit.builders import make_store, memory

pytestmark = pytest.mark.unit

EMB = HashingEmbedder()
POLICY = DecayPolicy()


def mem(content: str, mid: str, *, at: float = 0.0, last: float | None = None,
        extra: dict | None = None, **kw) -> Memory:
    return memory(content, mid=mid, at=at, **kw).evolve(last_accessed_at=last,
                                                        access_count=int(last is not None),
                                                        extra=extra or {})


def ctx(seq: int = 0, now: float = 0.0) -> Context:
    return Context("t1", "u1", "maintenance", 0, 0, f"maint-{seq}", now, seq=seq)


def decay(m: Memory, days: float, policy: DecayPolicy = POLICY) -> Plan:
    return plan_decay([m], days * DAY, policy, ctx())


def consolidate(memories: list[Memory], now: float = 10 * DAY) -> Plan:
    vectors = EMB.embed([m.content for m in memories])
    return plan_consolidation(memories, vectors, EMB.same_threshold, rules.decide, now, ctx())


def fact(text: str, mid: str, at: float = 0.0) -> Memory:
    """A memory as the rules extractor writes it from a user message."""
    [c] = rules.extract_text(text)
    return mem(c.text, mid, at=at, type=c.type.value, importance=c.importance, slot=c.slot)


# --- decay --------------------------------------------------------------------------------

@pytest.mark.parametrize(("days", "expected"), [
    (29, {}), (30, {"downweighted": 1}), (89, {"downweighted": 1}), (90, {"archived": 1})])
def test_decay_boundaries(days, expected):
    assert dict(decay(mem("Lives in Munich", "a"), days).counts) == expected


@pytest.mark.parametrize(("days", "expected"), [
    (30, {}), (89, {}), (90, {"downweighted": 1}), (269, {"downweighted": 1}),
    (270, {"archived": 1})])
@pytest.mark.parametrize("kind", ["reflection", "procedural"])
def test_reflections_and_rules_decay_slower(kind, days, expected):
    if kind == "reflection":
        m = mem("Profile: lives in Munich.", "r", extra={"kind": REFLECTION})
        assert is_reflection(m)
    else:
        m = mem("Prefers short answers", "p", type="procedural")
    assert dict(decay(m, days).counts) == expected


def test_ttl_expires_whatever_the_idleness():
    m = mem("Budget this month: 300", "b", last=9 * DAY, expires_at=10 * DAY)
    assert decay(m, 9.99).ops == []
    [op] = decay(m, 10).ops
    assert op.kind == OpKind.DELETE and op.reason == "expired: its time to live passed"
    assert (op.after.status, op.after.valid_to, op.after.content) == (
        Status.DELETED, 10 * DAY, m.content)


def test_a_hit_resets_idleness():
    m = mem("Lives in Munich", "a", last=20 * DAY)
    assert decay(m, 49).ops == [] and dict(decay(m, 50).counts) == {"downweighted": 1}
    assert dict(decay(m.evolve(last_accessed_at=None), 49).counts) == {"downweighted": 1}


def test_a_downweighted_memory_is_downweighted_once_then_archived():
    [op] = decay(mem("Lives in Munich", "a"), 30).ops
    again = op.after.evolve(last_accessed_at=None)
    assert decay(again, 31).ops == [] and decay(again, 89).ops == []
    assert dict(decay(again, 90).counts) == {"archived": 1}  # updated_at was kept
    assert decay(mem("x", "b", extra={"weight": 0.2}), 40).ops == []
    assert dict(decay(mem("x", "b", extra={"weight": 0.2}), 40,
                      DecayPolicy(weight=0.1)).counts) == {"downweighted": 1}


def test_decay_op_shapes():
    m = mem("Lives in Munich", "a", at=5.0, last=6.0, slot="residence", importance=7)
    now = 6.0 + 30 * DAY
    plan = plan_decay([m], now, POLICY, ctx(seq=4))
    [op] = plan.ops
    assert op.op_id == op_id("maint-4", 0, OpKind.UPDATE, 4) and plan.read == {"a": 1}
    closed, opened = op.writes
    assert (closed.version, closed.status, closed.valid_to) == (1, Status.SUPERSEDED, now)
    assert closed.extra["closed_by"] == op.op_id and closed.source == m.source
    assert opened is op.after and op.before.version == 1
    assert (opened.version, opened.status, opened.valid_from, opened.valid_to) == (
        2, Status.ACTIVE, now, None)
    assert (opened.content, opened.slot, opened.importance, opened.created_at,
            opened.updated_at) == (m.content, m.slot, 7, 5.0, 5.0)
    assert opened.extra == {"weight": POLICY.weight, "decayed_at": now}
    assert (opened.source.op_id, opened.source.job_id) == (op.op_id, "maint-4")
    assert all(r.last_accessed_at is None and r.access_count == 0 for r in op.writes)
    [arch] = plan_decay([m], 6.0 + 90 * DAY, POLICY, ctx()).ops
    assert arch.kind == OpKind.DELETE and arch.writes == (arch.after,)
    assert (arch.after.status, arch.after.valid_to, arch.after.content) == (
        Status.ARCHIVED, 6.0 + 90 * DAY, m.content)
    assert arch.reason == "archived: no retrieval for 90 days"


def test_every_op_has_its_own_index_and_core_blocks_and_closed_versions_stay():
    ms = [mem(f"fact {i}", f"m{i}", at=i * DAY) for i in range(6)]
    alone = [mem("Name: Ann", "k", slot="core:profile"), mem("x", "o", status="superseded")]
    plan = plan_decay([*ms, mem("b", "b", expires_at=DAY), *alone], 95 * DAY, POLICY,
                      ctx(seq=2))
    ids = [op.op_id for op in plan.ops]
    assert len(set(ids)) == len(ids) == 7
    assert plan.counts == {"archived": 6, "expired": 1}
    assert plan.read == {m.memory_id: 1 for m in [*ms, mem("b", "b")]}


# --- consolidation ------------------------------------------------------------------------

def test_paraphrases_from_two_sessions_merge_into_the_older():
    a = fact("I live in Munich.", "a", at=0.0).evolve(importance=6)
    b = fact("Oh and I now live in Munich!", "b", at=DAY)
    c = mem("Allergic to peanuts", "c", at=0.0, importance=9)
    d = mem("allergic to peanuts.", "d", at=2 * DAY, importance=9)
    plan = consolidate([b, c, a, d])
    assert plan.counts == {"merged": 2}
    survivors = {op.memory_id: op.after for op in plan.ops if op.kind == OpKind.UPDATE}
    assert set(survivors) == {"a", "c"}
    assert survivors["a"].extra["merged"] == ["b"] and survivors["a"].importance == 7
    assert survivors["a"].content == "Lives in Munich" and survivors["a"].version == 2
    closed = {op.memory_id: op.after for op in plan.ops if op.kind == OpKind.DELETE}
    assert closed["b"].status == Status.SUPERSEDED and closed["b"].extra["merged_into"] == "a"
    assert closed["d"].extra["merged_into"] == "c"
    assert plan.read == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_same_topic_different_value_never_merges():
    pair = [fact("I am allergic to peanuts.", "p"), fact("I'm allergic to penicillin.", "q",
                                                          at=DAY)]
    vectors = EMB.embed([m.content for m in pair])
    for threshold in (EMB.same_threshold, 0.0):  # cosine alone never merges
        plan = plan_consolidation(pair, vectors, threshold, rules.decide, 5 * DAY, ctx())
        assert plan.ops == []


@pytest.mark.parametrize("order", [1, -1])
def test_a_contradiction_keeps_the_newest(order):
    two = fact("I have two kids.", "two", at=0.0)
    three = fact("We moved and I have 3 children now.", "three", at=DAY)
    assert (two.slot, three.slot) == ("children", "children")
    plan = consolidate([two, three][::order])
    [op] = plan.ops
    assert plan.counts == {"superseded": 1} and op.memory_id == "two"
    assert (op.kind, op.after.status, op.after.valid_to) == (
        OpKind.DELETE, Status.SUPERSEDED, 10 * DAY)
    assert op.after.extra["superseded_by"] == "three"


def test_each_memory_takes_part_in_one_merge_per_run():
    same = [mem("Lives in Munich", f"m{i}", at=i * DAY, slot="residence") for i in range(3)]
    plan = consolidate(same)
    assert plan.counts == {"merged": 1}
    touched = [op.memory_id for op in plan.ops]
    assert len(touched) == len(set(touched)) == 2
    assert consolidate([same[0]]).ops == []


def test_consolidation_expires_and_skips_core_and_reflections():
    gone = mem("Budget this month: 300", "b", expires_at=3 * DAY)
    core = mem("Lives in Munich", "k", slot="core:profile")
    refl = mem("Lives in Munich", "r", extra={"kind": REFLECTION}, at=DAY)
    plan = consolidate([gone, core, refl, mem("Lives in Munich", "x", at=2 * DAY)])
    [op] = plan.ops
    assert plan.counts == {"expired": 1} and op.memory_id == "b"
    assert (op.after.status, op.after.valid_to) == (Status.DELETED, 3 * DAY)


# --- offline reflection -------------------------------------------------------------------

def profile() -> list[Memory]:
    return [
        mem("Lives in Berlin", "berlin", at=0.0, slot="residence", importance=7),
        mem("Lives in Munich", "munich", at=DAY, slot="residence", importance=7),
        mem("Has 3 children", "kids", at=0.0, slot="children", importance=7),
        mem("Works at Siemens.", "job", at=0.0, slot="employer", importance=6),
        mem("Prefers short answers", "short", type="procedural", importance=6),
        mem("Allergic to peanuts", "nuts", importance=9),
        mem("Budget this month: 300", "budget", importance=9, expires_at=30 * DAY),
        mem("Name: Ann", "core", slot="core:human", importance=8),
        mem("Profile: old", "old-refl", extra={"kind": REFLECTION}, importance=8),
    ]


def test_reflection_summarises_by_slot_and_type_with_real_evidence():
    plan = profile_reflection(profile(), None, 5 * DAY, ctx(seq=3))
    [op] = plan.ops
    r = op.after
    assert r.content == ("Profile: allergic to peanuts; lives in Munich; has 3 children; "
                         "works at Siemens. Preferences and rules: prefers short answers.")
    assert r.extra == {"kind": REFLECTION, "method": "rules-profile-1",
                       "evidence": ["nuts", "munich", "kids", "job", "short"]}
    assert (op.kind, r.slot, r.importance, r.type.value, r.version) == (
        OpKind.ADD, "reflection:profile", 8, "episodic", 1)
    assert is_reflection(r) and plan.counts == {"added": 1} and plan.read == {}


def test_reflection_is_updated_when_the_profile_changed_and_left_alone_when_not():
    first = profile_reflection(profile(), None, 5 * DAY, ctx()).ops[0].after
    assert profile_reflection(profile(), first, 6 * DAY, ctx()).ops == []
    moved = [*profile(), mem("Lives in Hamburg", "hh", at=2 * DAY, slot="residence",
                             importance=7)]
    plan = profile_reflection(moved, first, 6 * DAY, ctx(seq=5))
    [op] = plan.ops
    assert (op.kind, op.memory_id, op.after.version) == (OpKind.UPDATE, first.memory_id, 2)
    assert "lives in Hamburg" in op.after.content and "Munich" not in op.after.content
    assert "hh" in op.after.extra["evidence"] and "munich" not in op.after.extra["evidence"]
    assert op.writes[0].status == Status.SUPERSEDED and plan.counts == {"updated": 1}
    assert plan.read == {first.memory_id: 1}
    assert profile_reflection([], first, 6 * DAY, ctx()).ops == []


def test_reflection_is_short_and_keeps_the_most_important():
    many = [mem(f"Fact number {i} about the user and their long habits", f"f{i}",
                importance=1 + i % 10) for i in range(60)]
    r = profile_reflection(many, None, DAY, ctx()).ops[0].after
    assert len(r.content) <= 600
    kept = [m.importance for m in many if m.memory_id in r.extra["evidence"]]
    dropped = [m.importance for m in many if m.memory_id not in r.extra["evidence"]]
    assert dropped and kept.count(10) == 6 and min(kept) >= max(dropped)


# --- applied through the real decide -> apply path ----------------------------------------

@pytest.fixture(params=["edge", "server"])
def store(request, tmp_path):
    s = make_store(request.param, tmp_path, EMB.dim)
    yield s
    s.close()


def apply(store, plan: Plan, seq: int, now: float) -> None:
    job = ExtractionJob(job_id=f"maint-{seq}", seq=seq, tenant_id="t1", user_id="u1",
                        session_id="maintenance", from_seq=0, to_seq=0,
                        reason=TriggerReason.EXPLICIT, messages=[],
                        created_at=datetime.fromtimestamp(now, UTC))
    out = JobOutcome(ops=[(op, None if op.kind == OpKind.DELETE else
                           EMB.embed([op.after.content])[0]) for op in plan.ops],
                     read=dict(plan.read))
    applied = apply_decision(store, build_decision(job, out, RulesModel(), now))
    assert applied.status == JobStatus.DONE and applied.error is None
    assert [c.change_id for c in applied.publish] == [op.op_id for op in plan.ops]


def live(store) -> list[Memory]:
    return store.list(Scope("t1", "u1"))


def test_plans_apply_cleanly_on_a_real_store(store):
    seeded = [fact("I live in Munich.", "a"), fact("I now live in Munich!", "b", at=DAY),
              fact("I have two kids.", "c"), fact("I have 3 children.", "d", at=2 * DAY),
              fact("I am allergic to peanuts.", "e"), fact("allergic to penicillin", "f"),
              fact("I prefer short answers.", "g"),
              mem("Budget this month: 300", "h", expires_at=30 * DAY),
              mem("Name: Ann", "k", slot="core:human")]
    store.write(seeded, EMB.embed([m.content for m in seeded]))
    now = 3 * DAY
    apply(store, consolidate(live(store), now), 1, now)
    apply(store, profile_reflection(live(store), None, now, ctx(2, now)), 2, now)
    [refl] = [m for m in live(store) if is_reflection(m)]
    assert set(refl.extra["evidence"]) == {"a", "d", "e", "f", "g"}
    now = 40 * DAY
    plan = plan_decay(live(store), now, POLICY, ctx(3, now))
    assert plan.counts == {"expired": 1, "downweighted": 4}
    apply(store, plan, 3, now)
    assert plan_decay(live(store), now + DAY, POLICY, ctx(4, now + DAY)).ops == []
    state = sorted((m.memory_id, m.version, m.extra.get("weight")) for m in live(store))
    assert state == sorted([("a", 3, 0.5), ("d", 2, 0.5), ("e", 2, 0.5), ("f", 2, 0.5),
                            ("g", 1, None), ("k", 1, None), (refl.memory_id, 1, None)])
    everything = {(m.memory_id, m.version): m for m in
                  store.list(Scope("t1", "u1"), statuses=None)}
    assert everything[("b", 1)].extra["merged_into"] == "a"
    assert everything[("c", 1)].extra["superseded_by"] == "d"
    assert everything[("h", 1)].status == Status.DELETED
    assert everything[("a", 2)].extra["merged"] == ["b"]
