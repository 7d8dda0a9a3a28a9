"""Signed metadata and maps are bound to a join (issue 47, item 6): member metadata carries
the time it was made and its group, and the leader refuses it when it is old (a copy from
DescribeGroups replayed: a decommissioned worker's URL must not re-enter the map) or when a
newer member claims the same worker id; the map binds the group, the generation, the member
ids it was made for and its time, and a worker routes only with the map of its own join. A
static member handed its earlier assignment after a restart (no rebalance: KIP-345) asks
for a rejoin instead of routing with it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from memstream.core.cluster_auth import MAP, key_for
from memstream.streams.cluster import Cluster, ClusterMap, Worker, assignor_for, group_state
from memstream.streams.cluster_trust import GroupState, Trust, opened_map

pytestmark = pytest.mark.unit

SECRET = "cluster-secret-0123456789abcdef0123456789"
TOPICS = ("memstream.chat",)
A, B = Worker("w-a", "http://w-a:8000"), Worker("w-b", "http://w-b:8000")
GONE = Worker("w-gone", "http://decommissioned.example:8000")


class FakeCluster:
    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(4))


class Clock:
    def __init__(self, now: float = 10_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def trust(clock: Clock, max_age: float = 900.0) -> Trust:
    return Trust.of(SECRET, lambda *_: None, clock=clock, member_max_age_s=max_age)


def meta(worker: Worker, clock: Clock, group: str = "g") -> ConsumerProtocolMemberMetadata:
    """``worker``'s metadata as it joins now (by ``clock``), as the leader decodes it."""
    assignor = assignor_for(worker, 1, lambda _: None, trust(clock),
                            state=lambda: GroupState(group, 0, "") if group else None)
    return ConsumerProtocolMemberMetadata.decode(assignor.metadata(list(TOPICS)).encode())


def lead(members: dict[str, ConsumerProtocolMemberMetadata], clock: Clock,
         state: GroupState) -> dict[str, ConsumerProtocolMemberAssignment]:
    leader = assignor_for(A, 1, lambda _: None, trust(clock), state=lambda: state)
    out = leader.assign(FakeCluster(), members)
    return {m: ConsumerProtocolMemberAssignment.decode(a.encode()) for m, a in out.items()}


def envelope(a: ConsumerProtocolMemberAssignment) -> dict:
    return json.loads(a.user_data)


def take(worker: Worker, data: bytes, state: GroupState | None, clock: Clock,
         previous: ClusterMap | None = None) -> tuple[ClusterMap | None, int]:
    """What ``worker`` routes with after ``data`` reaches it in join ``state``, and how
    many rejoins it asked for."""
    cluster, rejoins = Cluster(worker, trust(clock)), []
    if previous is not None:
        cluster.update("apply", previous)
    assignor = assignor_for(worker, 1, lambda m: cluster.update("apply", m), cluster.trust,
                            state=lambda: state, rejoin=lambda: rejoins.append(1))
    assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [(TOPICS[0], [0])], data))
    return cluster.routing(), len(rejoins)


# --- the leader: what it binds, what it refuses ----------------------------------------------
def test_the_map_binds_the_group_generation_member_ids_and_time():
    clock = Clock()
    out = lead({"m-a": meta(A, clock), "m-b": meta(B, clock)}, clock, GroupState("g", 7, "m-a"))
    sent = envelope(out["m-b"])
    assert (sent["group"], sent["generation"], sent["made_at"]) == ("g", 7, clock.now)
    assert sent["members"] == {"m-a": "w-a", "m-b": "w-b"}
    the_map, rejoins = take(B, out["m-b"].user_data, GroupState("g", 7, "m-b"), clock)
    assert the_map is not None and set(the_map.workers) == {"w-a", "w-b"} and rejoins == 0
    tampered = dict(sent, generation=8)  # the signature covers the binding
    the_map, _ = take(B, json.dumps(tampered).encode(), GroupState("g", 8, "m-b"), clock)
    assert the_map is None


def test_metadata_older_than_the_bound_is_refused_so_a_gone_worker_stays_out():
    """A decommissioned worker's metadata, copied from DescribeGroups when it was live and
    replayed by another member an hour later, no longer brings its URL back."""
    clock = Clock()
    copied = meta(GONE, Clock(clock.now - 3600))
    out = lead({"m-a": meta(A, clock), "m-b": meta(B, clock), "m-replay": copied}, clock,
               GroupState("g", 3, "m-a"))
    the_map = ClusterMap.from_bytes(envelope(out["m-a"])["map"].encode())
    assert set(the_map.workers) == {"w-a", "w-b"}
    assert "http://decommissioned.example:8000" not in the_map.workers.values()
    assert envelope(out["m-replay"]) == {"v": 2, "ignored": True}
    assert out["m-replay"].partitions() == []
    fresh = meta(GONE, Clock(clock.now - 60))  # a live worker's, a minute into the rebalance
    out = lead({"m-a": meta(A, clock), "m-gone": fresh}, clock, GroupState("g", 4, "m-a"))
    assert "w-gone" in ClusterMap.from_bytes(envelope(out["m-a"])["map"].encode()).workers


def test_metadata_of_another_group_or_from_the_future_is_refused():
    clock = Clock()
    out = lead({"m-a": meta(A, clock), "m-b": meta(B, clock, group="other-group"),
                "m-c": meta(Worker("w-c", "http://w-c:1"), Clock(clock.now + 600))},
               clock, GroupState("g", 3, "m-a"))
    assert set(envelope(out["m-a"])["members"]) == {"m-a"}


def test_one_member_per_worker_id_the_newest_metadata():
    """The same worker id from two member ids (a copy replayed beside the live worker): the
    newer metadata is taken (the live worker makes new metadata at every join), the other
    gets nothing; the map binds the worker id to the member taken."""
    clock = Clock()
    old, new = meta(B, Clock(clock.now - 30)), meta(B, clock)
    out = lead({"m-a": meta(A, clock), "m-b-copy": old, "m-b-live": new}, clock,
               GroupState("g", 9, "m-a"))
    assert envelope(out["m-a"])["members"] == {"m-a": "w-a", "m-b-live": "w-b"}
    assert out["m-b-copy"].partitions() == [] and out["m-b-live"].partitions() != []


# --- the member: only the map of its own join ------------------------------------------------
def test_a_map_of_another_generation_or_member_is_not_routed_with_and_a_rejoin_asked():
    clock = Clock()
    out = lead({"m-a": meta(A, clock), "m-b": meta(B, clock)}, clock, GroupState("g", 7, "m-a"))
    data = out["m-b"].user_data
    previous = ClusterMap({"w-b": "http://w-b:8000"}, {0: "w-b"})
    for state in (GroupState("g", 8, "m-b"),  # an old map (replayed) after a rebalance
                  GroupState("g", 7, "m-b-restarted"),  # a static member's old assignment
                  GroupState("other", 7, "m-b")):
        the_map, rejoins = take(B, data, state, clock, previous)
        assert the_map == previous and rejoins == 1, state
    the_map, rejoins = take(B, data, None, clock, previous)  # no join known: nothing taken
    assert the_map == previous and rejoins == 0


def test_an_old_map_of_this_join_is_refused_without_a_rejoin():
    clock = Clock()
    out = lead({"m-a": meta(A, clock), "m-b": meta(B, clock)}, clock, GroupState("g", 7, "m-a"))
    later = Clock(clock.now + 3600)
    the_map, rejoins = take(B, out["m-b"].user_data, GroupState("g", 7, "m-b"), later)
    assert the_map is None and rejoins == 0
    with pytest.raises(ValueError, match="ago"):
        opened_map(out["m-b"].user_data, key_for(SECRET, MAP), state=GroupState("g", 7, "m-b"),
                   me="w-b", now=later.now)


def test_a_restarted_static_member_rejoins_and_routes_with_the_new_generations_map():
    """KIP-345: a static follower restarting in a stable group gets a new member id, the
    same generation and its earlier assignment (made for its old member id). It asks to
    rejoin; its new metadata makes the broker rebalance; the next map names it."""
    clock = Clock()
    first = lead({"m-a": meta(A, clock), "m-b-1": meta(B, clock)}, clock,
                 GroupState("g", 7, "m-a"))
    cluster, rejoins = Cluster(B, trust(clock)), []
    state = {"now": GroupState("g", 7, "m-b-2")}  # restarted: new member id, same generation
    assignor = assignor_for(B, 1, lambda m: cluster.update("apply", m), cluster.trust,
                            state=lambda: state["now"], rejoin=lambda: rejoins.append(1))
    assignor.on_assignment(first["m-b-1"])
    assert cluster.routing() is None and rejoins == [1]
    clock.now += 5
    second = lead({"m-a": meta(A, clock), "m-b-2": meta(B, clock)}, clock,
                  GroupState("g", 8, "m-a"))
    state["now"] = GroupState("g", 8, "m-b-2")
    assignor.on_assignment(second["m-b-2"])
    assert cluster.routing() is not None and cluster.routing().owned_by("w-b")
    assert rejoins == [1]


def test_the_assignor_reads_its_consumers_join():
    coordinator = SimpleNamespace(group_id="g", generation=-1, member_id="", rejoined=0)
    coordinator.request_rejoin = lambda: setattr(coordinator, "rejoined", 1)
    consumer = SimpleNamespace(_group_id="g", _coordinator=None)
    clock = Clock()
    assignor = assignor_for(B, 1, lambda _: None, trust(clock))
    assignor.bind(consumer)  # made, not started: no coordinator, no join yet
    assert json.loads(assignor.metadata(list(TOPICS)).user_data)["group"] == "g"
    consumer._coordinator = coordinator  # started: the first join's metadata
    assert group_state(consumer) is None
    assert json.loads(assignor.metadata(list(TOPICS)).user_data)["group"] == "g"
    coordinator.generation, coordinator.member_id = 4, "m-1"  # joined
    assert group_state(consumer) == GroupState("g", 4, "m-1")
    assert group_state(SimpleNamespace()) is None
    assert group_state(SimpleNamespace(_coordinator=SimpleNamespace(
        group_id="g", generation=-1, member_id=""))) is None
    out = lead({"m-a": meta(A, clock), "m-1": meta(B, clock)}, clock, GroupState("g", 3, "m-a"))
    assignor.on_assignment(out["m-1"])  # generation 3, its consumer joined 4: a rejoin
    assert coordinator.rejoined == 1
