"""The store split by partition (memory.store.partitioned): a user's calls go to the shard of
the user's partition (the producers' partition of ``tenant/user``); a shard not served here raises
ShardNotHere; standby shards serve reads only inside ``standby_reads()`` and never writes;
the global shard's memories join a search / list that includes the global scope."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner

from memstream.memory.access_stats import AccessStats
from memstream.memory.fencing import Cursor
from memstream.memory.model import GLOBAL_USER
from memstream.memory.store import Scope, StoreError
from memstream.memory.store.partitioned import (
    PartitionedStore,
    ShardNotHere,
    partition_of,
    standby_reads,
)
from memstream.topics.schemas import user_key
from tests.unit.builders import make_store, memory

pytestmark = pytest.mark.unit
DIM = 4
N = 4
T = "t1"


def vec(*xs: float) -> list[float]:
    return [*xs, *([0.0] * (DIM - len(xs)))]


def user_in(partition: int, skip: int = 0) -> str:
    """A user id whose key lands in ``partition`` (the ``skip``-th such)."""
    found = (f"u{i}" for i in range(10_000) if partition_of(T, f"u{i}", N) == partition)
    for _ in range(skip):
        next(found)
    return next(found)


@pytest.fixture
def shards(tmp_path):
    """Owned: partitions 0 (server store) and 1 (Edge store); standby: 2; global shard."""
    store = PartitionedStore(lambda tenant, user: partition_of(tenant, user, N))
    store.owned[0] = make_store("server", tmp_path / "p0", DIM)
    store.owned[1] = make_store("edge", tmp_path / "p1", DIM)
    store.standby[2] = make_store("server", tmp_path / "p2", DIM)
    store.global_shard = make_store("server", tmp_path / "global", DIM)
    yield store
    store.close()


# --- the partition of a user ---------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3, 4, 12, 64])
def test_a_user_partition_is_the_producers_default_partition(n):
    partitioner = DefaultPartitioner()
    keys = [("t1", "u1"), ("t1", "u2"), ("acme", "alice"), ("acme", GLOBAL_USER),
            ("tenant-ü", "user/with/slashes"), ("", "")]
    for tenant, user in keys:
        key = user_key(tenant, user).encode()
        assert key == f"{tenant}/{user}".encode()
        assert partition_of(tenant, user, n) == partitioner(key, list(range(n)), [])


def test_users_spread_over_the_partitions():
    counts = [0] * N
    for i in range(400):
        counts[partition_of(T, f"u{i}", N)] += 1
    assert all(c > 50 for c in counts), counts


# --- owned shards --------------------------------------------------------------------------

def test_writes_and_reads_go_to_the_user_shard(shards):
    a, b = user_in(0), user_in(1)
    shards.write([memory("a likes tea", mid="ma", user=a),
                  memory("b likes coffee", mid="mb", user=b)], [vec(1), vec(0, 1)])
    assert [m.memory_id for m in shards.owned[0].list(Scope(T, a))] == ["ma"]
    assert shards.owned[0].list(Scope(T, b)) == []
    assert [m.memory_id for m in shards.owned[1].list(Scope(T, b))] == ["mb"]
    assert [m.content for m in shards.list(Scope(T, a))] == ["a likes tea"]
    [(hit, score)] = shards.search(Scope(T, b), vec(0, 1), 5)
    assert hit.memory_id == "mb" and score == pytest.approx(1.0, abs=1e-5)
    assert shards.live_versions(Scope(T, a), ["ma", "mb"]) == {"ma": 1}
    assert shards.op_applied(Scope(T, b), "op-mb-1")
    assert not shards.op_applied(Scope(T, a), "op-mb-1")
    assert shards.count() == 2
    assert sorted(p["memory_id"] for _, p, _ in shards.scan(T, b)) == ["mb"]
    assert sorted(p["memory_id"] for _, p, _ in shards.scan()) == ["ma", "mb"]


def test_cursor_and_hit_statistics_live_in_the_user_shard(shards):
    a = user_in(1)
    shards.set_cursor(Scope(T, a), Cursor(3, "job-3"), ["{}"])
    shards.put_access(Scope(T, a), [AccessStats("m1", 5.0, 2)])
    assert shards.cursor(Scope(T, a)) == Cursor(3, "job-3")
    assert shards.owned[1].cursor(Scope(T, a)) == Cursor(3, "job-3")
    assert shards.published(Scope(T, a)).changes == ("{}",)
    assert shards.access_stats(Scope(T, a), ["m1"])["m1"].access_count == 2
    assert shards.owned[0].cursor(Scope(T, a)) is None


def test_erase_deletes_the_user_in_its_shard_only(shards):
    a, a2 = user_in(0), user_in(0, skip=1)
    shards.write([memory("x", mid="m1", user=a), memory("y", mid="m2", user=a2)],
                 [vec(1), vec(1)])
    assert shards.erase(Scope(T, a, include_global=True)) == 1
    assert shards.list(Scope(T, a)) == []
    assert [m.memory_id for m in shards.list(Scope(T, a2))] == ["m2"]


def test_a_user_of_a_partition_not_here_raises_shard_not_here(shards):
    away = user_in(3)
    scope = Scope(T, away)
    calls = [
        lambda: shards.list(scope),
        lambda: shards.search(scope, vec(1), 3),
        lambda: shards.cursor(scope),
        lambda: shards.op_applied(scope, "x"),
        lambda: shards.live_versions(scope, ["x"]),
        lambda: shards.access_stats(scope, ["x"]),
        lambda: shards.published(scope),
        lambda: shards.write([memory("x", mid="m9", user=away)], [vec(1)]),
        lambda: shards.set_cursor(scope, Cursor(1, "j")),
        lambda: shards.put_access(scope, [AccessStats("m9")]),
        lambda: shards.erase(scope),
        lambda: list(shards.scan(T, away)),
    ]
    for call in calls:
        with pytest.raises(ShardNotHere) as caught:
            call()
        assert caught.value.partition == 3
        assert isinstance(caught.value, StoreError)
    with standby_reads(), pytest.raises(ShardNotHere) as caught:
        shards.list(scope)  # no standby of 3 either
    assert caught.value.partition == 3


def test_a_write_of_several_users_names_the_missing_shard(shards):
    here, away = user_in(0), user_in(3)
    with pytest.raises(ShardNotHere) as caught:
        shards.write_records([(memory("x", mid="m1", user=here).point_id,
                               memory("x", mid="m1", user=here).to_payload(), vec(1)),
                              (memory("y", mid="m2", user=away).point_id,
                               memory("y", mid="m2", user=away).to_payload(), vec(1))])
    assert caught.value.partition == 3


# --- standby shards ------------------------------------------------------------------------

def test_a_standby_shard_is_read_only_inside_standby_reads(shards):
    s = user_in(2)
    shards.standby[2].write([memory("followed", mid="ms", user=s)], [vec(0, 0, 1)])
    shards.standby[2].set_cursor(Scope(T, s), Cursor(7, "j7"))
    with pytest.raises(ShardNotHere) as caught:
        shards.list(Scope(T, s))
    assert caught.value.partition == 2
    with standby_reads():
        assert [m.memory_id for m in shards.list(Scope(T, s))] == ["ms"]
        [(hit, _)] = shards.search(Scope(T, s), vec(0, 0, 1), 3)
        assert hit.memory_id == "ms"
        assert shards.cursor(Scope(T, s)) == Cursor(7, "j7")
    with pytest.raises(ShardNotHere):  # the context is over
        shards.cursor(Scope(T, s))


def test_a_standby_shard_is_never_written(shards):
    s = user_in(2)
    with standby_reads():
        for write in (
            lambda: shards.write([memory("x", mid="mx", user=s)], [vec(1)]),
            lambda: shards.set_cursor(Scope(T, s), Cursor(1, "j1")),
            lambda: shards.put_access(Scope(T, s), [AccessStats("mx", 1.0, 1)]),
            lambda: shards.erase(Scope(T, s)),
        ):
            with pytest.raises(ShardNotHere) as caught:
                write()
            assert caught.value.partition == 2
    assert shards.standby[2].list(Scope(T, s), statuses=None) == []
    assert shards.standby[2].cursor(Scope(T, s)) is None


def test_count_sums_the_owned_shards_only(shards):
    a, b, s = user_in(0), user_in(1), user_in(2)
    shards.write([memory("a1", mid="a1", user=a), memory("a2", mid="a2", user=a),
                  memory("b1", mid="b1", user=b)], [vec(1), vec(1), vec(1)])
    shards.standby[2].write([memory("s1", mid="s1", user=s)], [vec(1)])
    shards.global_shard.write([memory("g1", mid="g1", user=GLOBAL_USER)], [vec(1)])
    assert shards.count() == 3


# --- the global shard ----------------------------------------------------------------------

def test_a_global_shard_that_never_held_anything_is_not_asked(shards, monkeypatch):
    """No global change was ever folded (the usual case): a search or a list is one shard
    call, not two (the partitioned store's search was 1.4x the single store's)."""
    a = user_in(0)
    shards.write([memory("mine", mid="u1", user=a)], [vec(1)])
    asked: list[str] = []
    original = shards.global_shard.search
    monkeypatch.setattr(shards.global_shard, "search",
                        lambda *args, **kw: asked.append("search") or original(*args, **kw))
    shards.global_filled = False
    scope = Scope(T, a, include_global=True)
    assert [m.memory_id for m, _ in shards.search(scope, vec(1), 3)] == ["u1"]
    assert [m.memory_id for m in shards.list(scope)] == ["u1"] and asked == []
    shards.global_shard.write([memory("g", mid="g1", user=GLOBAL_USER)], [vec(1, 0.1)])
    shards.global_filled = True  # what the global copy sets once it folds a change
    assert {m.memory_id for m, _ in shards.search(scope, vec(1), 3)} == {"u1", "g1"}
    assert asked == ["search"]


def test_search_with_the_global_scope_merges_the_top_k_by_score(shards):
    a = user_in(0)
    shards.write([memory("close", mid="u-close", user=a),
                  memory("far", mid="u-far", user=a)], [vec(1, 0.1), vec(0.1, 1)])
    shards.global_shard.write([memory("g close", mid="g-close", user=GLOBAL_USER),
                               memory("g mid", mid="g-mid", user=GLOBAL_USER)],
                              [vec(1, 0.05), vec(1, 0.5)])
    hits = shards.search(Scope(T, a, include_global=True), vec(1), 3)
    assert [m.memory_id for m, _ in hits] == ["g-close", "u-close", "g-mid"]
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True)
    own = shards.search(Scope(T, a), vec(1), 3)
    assert [m.memory_id for m, _ in own] == ["u-close", "u-far"]


def test_list_with_the_global_scope_adds_the_global_memories(shards):
    a = user_in(1)
    shards.write([memory("mine", mid="m1", user=a)], [vec(1)])
    shards.global_shard.write([memory("everyone 1", mid="g1", user=GLOBAL_USER),
                               memory("everyone 2", mid="g2", user=GLOBAL_USER)],
                              [vec(1), vec(0, 1)])
    listed = shards.list(Scope(T, a, include_global=True))
    assert listed[0].memory_id == "m1"  # the user's own first
    assert sorted(m.memory_id for m in listed) == ["g1", "g2", "m1"]
    assert len(shards.list(Scope(T, a, include_global=True), limit=2)) == 2
    assert [m.memory_id for m in shards.list(Scope(T, a))] == ["m1"]


def test_the_global_scope_of_another_tenant_is_not_merged(shards):
    a = user_in(0)
    shards.write([memory("mine", mid="m1", user=a)], [vec(1)])
    shards.global_shard.write([memory("theirs", mid="g1", user=GLOBAL_USER, tenant="t2")],
                              [vec(1)])
    assert [m.memory_id for m in shards.list(Scope(T, a, include_global=True))] == ["m1"]
    assert [m.memory_id for m, _ in shards.search(Scope(T, a, include_global=True),
                                                   vec(1), 5)] == ["m1"]


def test_the_global_user_reads_its_own_shard_not_the_global_copy_twice(tmp_path):
    owner = partition_of(T, GLOBAL_USER, N)
    store = PartitionedStore(lambda tenant, user: partition_of(tenant, user, N))
    store.owned[owner] = make_store("server", tmp_path / "own", DIM)
    store.global_shard = make_store("server", tmp_path / "global", DIM)
    g = memory("semantic", mid="g1", user=GLOBAL_USER)
    store.write([g], [vec(1)])
    store.global_shard.write([g], [vec(1)])
    scope = Scope(T, GLOBAL_USER, include_global=True)
    assert [m.memory_id for m in store.list(scope)] == ["g1"]
    assert [m.memory_id for m, _ in store.search(scope, vec(1), 5)] == ["g1"]
    assert store.access_stats(scope, ["g1"]) == {}
    store.close()


def test_close_closes_and_forgets_every_shard(shards):
    shards.close()
    assert shards.owned == {} and shards.standby == {} and shards.global_shard is None


class ClosedMidRead:
    """A shard that fails a read as a closed Qdrant Edge shard does; ``leave`` is what
    the keeper did meanwhile (popped it from the served shards, or not)."""

    def __init__(self, leave) -> None:
        self.leave = leave

    def search(self, *args, **kwargs):
        self.leave()
        raise RuntimeError("shard is closed")

    list = search


@pytest.mark.parametrize("read", ["search", "list"])
def test_a_read_whose_shard_closed_meanwhile_is_shard_not_here_not_an_error(read):
    store = PartitionedStore(lambda tenant, user: 2)
    store.owned[2] = ClosedMidRead(lambda: store.owned.pop(2))  # type: ignore[assignment]
    args = (vec(1.0, 0.0, 0.0), 3) if read == "search" else ()
    with pytest.raises(ShardNotHere, match="closed while it was read"):
        getattr(store, read)(Scope("acme", "u1"), *args)
    store.owned[2] = ClosedMidRead(lambda: None)  # type: ignore[assignment]  # still served
    with pytest.raises(RuntimeError, match="shard is closed"):  # a real failure stays one
        getattr(store, read)(Scope("acme", "u1"), *args)
