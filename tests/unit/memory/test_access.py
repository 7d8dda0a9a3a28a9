"""Folding access events into per-memory statistics (memory.access_stats), and storing them."""

from __future__ import annotations

import itertools

import pytest

from memstream.memory.access_stats import Access, AccessStats, fold, fold_one, memory_ids
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.fencing import Cursor
from memstream.memory.store import Scope
from tests.unit.builders import make_store, memory

pytestmark = pytest.mark.unit


def hit(event_id: str, *mids: str, ts: float = 0.0, kind: str = "hit") -> Access:
    return Access(event_id, kind, mids, ts)


# --- the pure fold ------------------------------------------------------------------------

def test_a_hit_counts_and_moves_last_access():
    stats = fold_one(AccessStats("m1"), hit("e1", "m1", ts=50.0))
    stats = fold_one(stats, hit("e2", "m1", ts=70.0))
    assert (stats.access_count, stats.last_accessed_at) == (2, 70.0)
    assert stats.recent_events == ("e1", "e2")


def test_an_older_hit_folded_late_does_not_move_last_access_back():
    stats = fold_one(AccessStats("m1"), hit("new", "m1", ts=90.0))
    stats = fold_one(stats, hit("old", "m1", ts=10.0))
    assert (stats.access_count, stats.last_accessed_at) == (2, 90.0)


def test_feedback_counts_apart_and_leaves_recency_alone():
    stats = AccessStats("m1")
    for n, kind in enumerate(["used", "used", "not_useful"]):
        stats = fold_one(stats, hit(f"f{n}", "m1", ts=100.0, kind=kind))
    assert (stats.used, stats.not_useful) == (2, 1)
    assert (stats.access_count, stats.last_accessed_at) == (0, None)


def test_an_event_delivered_twice_counts_once():
    once = fold({}, [hit("e1", "m1", "m2", ts=5.0)])
    again = fold(once, [hit("e1", "m1", "m2", ts=5.0)])
    assert again == {}  # nothing changed, nothing to write
    twice_in_a_batch = fold({}, [hit("e1", "m1", ts=5.0), hit("e1", "m1", ts=5.0)])
    assert twice_in_a_batch["m1"].access_count == 1


def test_a_memory_named_twice_in_one_event_counts_once():
    assert fold({}, [hit("e1", "m1", "m1")])["m1"].access_count == 1


def test_fold_returns_only_what_changed_and_does_not_mutate_its_input():
    current = {"m1": AccessStats("m1", 3.0, 1, recent_events=("e0",)),
               "m2": AccessStats("m2", 4.0, 1, recent_events=("e0",))}
    before = dict(current)
    changed = fold(current, [hit("e1", "m1", ts=9.0), hit("e0", "m2")])
    assert set(changed) == {"m1"} and changed["m1"].access_count == 2
    assert current == before


def test_the_remembered_event_ids_are_bounded():
    stats = AccessStats("m1")
    for n in range(10):
        stats = fold_one(stats, hit(f"e{n}", "m1", ts=float(n)), keep=4)
    assert stats.recent_events == ("e6", "e7", "e8", "e9")
    assert stats.access_count == 10
    # Within the window a redelivery is recognised; beyond it, it no longer is (documented).
    assert fold_one(stats, hit("e9", "m1"), keep=4) is stats
    assert fold_one(stats, hit("e0", "m1"), keep=4).access_count == 11


def test_the_order_of_events_does_not_change_the_result():
    events = [hit("a", "m1", ts=3.0), hit("b", "m1", "m2", ts=8.0),
              hit("c", "m2", ts=1.0, kind="used"), hit("d", "m1", ts=5.0, kind="not_useful")]

    def numbers(state):
        return tuple(sorted((m, s.access_count, s.last_accessed_at, s.used, s.not_useful)
                            for m, s in state.items()))

    results = {numbers(fold({}, order)) for order in itertools.permutations(events)}
    assert results == {(("m1", 2, 8.0, 0, 1), ("m2", 1, 8.0, 1, 0))}


def test_payload_round_trip_and_tolerant_reader():
    stats = AccessStats("m1", 12.5, 3, 2, 1, ("e1", "e2"))
    assert AccessStats.from_payload(stats.to_payload()) == stats
    assert AccessStats.from_payload({"memory_id": "m9"}) == AccessStats("m9")


def test_memory_ids_are_unique_in_first_seen_order():
    assert memory_ids([hit("a", "m2", "m1"), hit("b", "m1", "m3")]) == ["m2", "m1", "m3"]


# --- the stores --------------------------------------------------------------------------

@pytest.fixture(params=["edge", "server"])
def store(request, tmp_path):
    s = make_store(request.param, tmp_path, HashingEmbedder().dim)
    yield s
    s.close()


def test_stats_are_stored_per_user_and_read_back(store):
    u1, u2 = Scope("t1", "u1"), Scope("t1", "u2")
    store.put_access(u1, [AccessStats("m1", 10.0, 2, recent_events=("e1", "e2")),
                          AccessStats("m2", 11.0, 1)])
    assert store.access_stats(u1, ["m1", "m2", "m3"]) == {
        "m1": AccessStats("m1", 10.0, 2, recent_events=("e1", "e2")),
        "m2": AccessStats("m2", 11.0, 1)}
    assert store.access_stats(u2, ["m1", "m2"]) == {}  # another reader's hits are not ours
    assert store.access_stats(Scope("t2", "u1"), ["m1"]) == {}
    store.put_access(u1, [AccessStats("m1", 20.0, 3)])  # overwritten, not appended
    assert store.access_stats(u1, ["m1"])["m1"].access_count == 3
    assert store.access_stats(u1, []) == {}


def test_stats_and_cursor_never_show_up_as_memories(store):
    emb = HashingEmbedder()
    scope = Scope("t1", "u1")
    m = memory("Lives in Oslo", mid="m1")
    store.write([m], emb.embed([m.content]))
    store.put_access(scope, [AccessStats("m1", 10.0, 1)])
    store.set_cursor(scope, Cursor(3, "job-3"))
    assert [x.memory_id for x in store.list(scope, statuses=None)] == ["m1"]
    everything = ["active", "archived", "superseded", "deleted"]
    # The placeholder vector of a hidden record must not match a search either.
    found = store.search(scope, [1.0] + [0.0] * (emb.dim - 1), 10, everything)
    assert [x.memory_id for x, _ in found] == ["m1"]
    assert store.cursor(scope) == Cursor(3, "job-3")
    assert not store.op_applied(scope, "nothing-here")


def test_ops_applied_finds_each_mark_an_op_leaves_in_one_read(store):
    """An op's id is on the version it opened, the one it closed and the one it restated;
    another user's record with the same op id is not this user's."""
    emb = HashingEmbedder()
    scope = Scope("t1", "u1")
    opened = memory("Lives in Oslo", mid="m1")  # source.op_id op-m1-1
    closed = memory("Lives in Rome", mid="m0", status="superseded").evolve(
        extra={"closed_by": "op-close"})
    restated = memory("Likes tea", mid="m2").evolve(extra={"restated_by": "op-restate"})
    elsewhere = memory("Lives in Oslo", mid="m9", user="u2").evolve(extra={"closed_by": "op-x"})
    for m in (opened, closed, restated, elsewhere):
        store.write([m], emb.embed([m.content]))
    asked = ["op-m1-1", "op-close", "op-restate", "op-x", "op-never", "op-m1-1"]
    found = store.ops_applied(scope, asked)
    assert found == {"op-m1-1", "op-close", "op-restate"}
    assert found == {i for i in asked if store.op_applied(scope, i)}
    assert store.ops_applied(scope, []) == set()


def test_ops_applied_past_its_read_limit_still_answers_exactly(store):
    """Many records carrying the asked ids (more than one read returns): counted one by
    one, the same answer."""
    emb = HashingEmbedder()
    scope = Scope("t1", "u1")
    many = [memory(f"fact {i}", mid=f"m{i}", status="superseded").evolve(
        extra={"closed_by": "op-busy"}) for i in range(30)]
    store.write(many, emb.embed([m.content for m in many]))
    assert store.ops_applied(scope, ["op-busy", "op-none"]) == {"op-busy"}
