"""The cluster map (streams.cluster): the pure plan (range over the workers in worker-id
order, standbys the next workers), the map's bytes, and the group leader's assignment with
aiokafka's protocol structs (every group of the same workers gets the same partitions per
worker, whatever the broker's member ids)."""

from __future__ import annotations

import json
import random

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from memstream.streams.cluster import (
    ASSIGNOR_NAME,
    Cluster,
    ClusterMap,
    Worker,
    assign,
    assignor_for,
    plan,
    worker_of,
)

pytestmark = pytest.mark.unit

TOPICS = ("memstream.chat", "memstream.memory-changes")
W = {name: Worker(name, f"http://{name}:8000") for name in ("w-a", "w-b", "w-c", "w-d")}


def workers(*names: str) -> list[Worker]:
    return [W[n] for n in names]


class FakeCluster:
    """What the assignor asks of the client's cluster metadata."""

    def __init__(self, partitions: dict[str, int]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.partitions.get(topic)
        return set(range(n)) if n is not None else None


def meta(worker: Worker | None, topics=TOPICS, user_data: bytes | None = None):
    """A member's metadata as the leader gets it: encoded by the member, decoded."""
    if user_data is None and worker is not None:
        user_data = json.dumps({"worker": worker.worker_id, "url": worker.url}).encode()
    raw = ConsumerProtocolMemberMetadata(0, list(topics), user_data or b"").encode()
    return ConsumerProtocolMemberMetadata.decode(raw)


def decoded(assignment: ConsumerProtocolMemberAssignment) -> ConsumerProtocolMemberAssignment:
    """As the member receives it (the leader encodes, the broker hands the bytes over)."""
    return ConsumerProtocolMemberAssignment.decode(assignment.encode())


def by_topic(assignment: ConsumerProtocolMemberAssignment) -> dict[str, list[int]]:
    return {t: list(ps) for t, ps in assignment.assignment}


# --- plan ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("names", "expected"), [
    (("w-a",), {"w-a": set(range(12))}),
    (("w-a", "w-b"), {"w-a": set(range(6)), "w-b": set(range(6, 12))}),
    (("w-a", "w-b", "w-c"), {"w-a": {0, 1, 2, 3}, "w-b": {4, 5, 6, 7},
                             "w-c": {8, 9, 10, 11}}),
])
def test_twelve_partitions_go_by_range_in_worker_id_order(names, expected):
    the_map = plan(workers(*names), range(12), None)
    assert {w: the_map.owned_by(w) for w in names} == expected
    assert the_map.workers == {n: f"http://{n}:8000" for n in names}
    assert sorted(the_map.owners) == list(range(12))


def test_an_uneven_split_gives_the_first_workers_one_more():
    the_map = plan(workers("w-c", "w-a", "w-b"), range(8), 0)
    assert the_map.owned_by("w-a") == {0, 1, 2}
    assert the_map.owned_by("w-b") == {3, 4, 5}
    assert the_map.owned_by("w-c") == {6, 7}


def test_the_same_workers_in_any_order_give_the_same_map():
    names = ["w-a", "w-b", "w-c", "w-d"]
    first = plan(workers(*names), range(12), 1, now=5.0)
    rng = random.Random(3)
    for _ in range(10):
        rng.shuffle(names)
        parts = list(range(12))
        rng.shuffle(parts)
        again = plan(workers(*names), parts, 1, now=5.0)
        assert again == first
        assert again.to_bytes() == first.to_bytes()


def test_a_worker_named_twice_counts_once():
    the_map = plan([*workers("w-a", "w-b"), W["w-a"]], range(4), 0)
    assert the_map.owned_by("w-a") == {0, 1} and the_map.owned_by("w-b") == {2, 3}


@pytest.mark.parametrize(("names", "replicas", "expected"), [
    (("w-a",), None, 0),
    (("w-a",), 2, 0),
    (("w-a", "w-b"), None, 1),
    (("w-a", "w-b", "w-c"), None, 1),
    (("w-a", "w-b", "w-c"), 0, 0),
    (("w-a", "w-b", "w-c"), 2, 2),
    (("w-a", "w-b", "w-c"), 5, 2),  # capped at n - 1
])
def test_standbys_are_the_next_workers_never_the_owner(names, replicas, expected):
    the_map = plan(workers(*names), range(12), replicas)
    ordered = sorted(names)
    for p, owner in the_map.owners.items():
        standbys = the_map.standbys[p]
        assert len(standbys) == expected
        assert owner not in standbys
        assert len(set(standbys)) == len(standbys)
        i = ordered.index(owner)
        assert list(standbys) == [ordered[(i + j) % len(ordered)]
                                  for j in range(1, expected + 1)]


def test_standby_of_names_the_partitions_a_worker_follows():
    the_map = plan(workers("w-a", "w-b", "w-c"), range(6), 1)
    # owners: a {0,1}, b {2,3}, c {4,5}; standby: the next worker, wrapping
    assert the_map.standby_of("w-b") == {0, 1}
    assert the_map.standby_of("w-c") == {2, 3}
    assert the_map.standby_of("w-a") == {4, 5}
    assert the_map.owner_url(4) == "http://w-c:8000"
    assert the_map.owner_url(99) is None


def test_no_workers_give_an_empty_map():
    the_map = plan([], range(4), None, now=3.0)
    assert the_map == ClusterMap(made_at=3.0)
    assert the_map.owner_url(0) is None


def test_the_map_survives_its_bytes():
    the_map = plan(workers("w-b", "w-a", "w-c"), range(7), 2, now=1234.5)
    back = ClusterMap.from_bytes(the_map.to_bytes())
    assert back == the_map
    assert back.owners[6] == "w-c" and back.standbys[6] == ("w-a", "w-b")
    assert back.made_at == 1234.5
    assert all(isinstance(p, int) for p in back.owners)


# --- assign: the group leader --------------------------------------------------------------

def test_every_member_gets_the_same_partitions_of_both_topics():
    cluster = FakeCluster({TOPICS[0]: 12, TOPICS[1]: 12})
    members = {"m-3": meta(W["w-c"]), "m-1": meta(W["w-a"]), "m-2": meta(W["w-b"])}
    out = {m: decoded(a) for m, a in assign(cluster, members, None).items()}
    assert set(out) == set(members)
    expected = {"m-1": [0, 1, 2, 3], "m-2": [4, 5, 6, 7], "m-3": [8, 9, 10, 11]}
    for member, assignment in out.items():
        assert by_topic(assignment) == {t: expected[member] for t in TOPICS}
    for topic in TOPICS:
        union = [p for a in out.values() for p in by_topic(a)[topic]]
        assert sorted(union) == list(range(12))  # every partition exactly once
    maps = {a.user_data for a in out.values()}
    assert len(maps) == 1  # the same map in every member's assignment
    the_map = ClusterMap.from_bytes(maps.pop())
    assert the_map.owned_by("w-b") == {4, 5, 6, 7}
    assert the_map.workers["w-c"] == "http://w-c:8000"
    assert the_map.standbys[0] == ("w-b",)  # None replicas, several workers: 1


def test_two_groups_of_the_same_workers_align_whatever_the_member_ids():
    cluster = FakeCluster({TOPICS[0]: 12, TOPICS[1]: 12})
    ingest = {"consumer-zz-1": meta(W["w-a"], TOPICS[:1]),
              "consumer-aa-2": meta(W["w-b"], TOPICS[:1]),
              "consumer-mm-3": meta(W["w-c"], TOPICS[:1])}
    apply = {"x-9": meta(W["w-c"], TOPICS[1:]), "x-1": meta(W["w-b"], TOPICS[1:]),
             "x-5": meta(W["w-a"], TOPICS[1:])}

    def per_worker(members, topic):
        out = assign(cluster, members, 1)
        return {json.loads(members[m].user_data)["worker"]: by_topic(decoded(a))[topic]
                for m, a in out.items()}

    first, second = per_worker(ingest, TOPICS[0]), per_worker(apply, TOPICS[1])
    assert first == second
    assert first == {"w-a": [0, 1, 2, 3], "w-b": [4, 5, 6, 7], "w-c": [8, 9, 10, 11]}


def test_a_member_without_our_metadata_is_still_assigned():
    """Without a trust (nothing checked); with the cluster secret such a member is ignored
    (tests/unit/streams/test_cluster_trust.py)."""
    cluster = FakeCluster({TOPICS[0]: 6, TOPICS[1]: 6})
    members = {"m-1": meta(W["w-a"]), "zz-stranger": meta(None, user_data=b""),
               "m-2": meta(W["w-b"], user_data=b"not json")}
    out = {m: decoded(a) for m, a in assign(cluster, members, 0).items()}
    # worker ids: w-a, "m-2" (unreadable metadata), "zz-stranger"; sorted: m-2 < w-a < zz
    assert by_topic(out["m-2"]) == {t: [0, 1] for t in TOPICS}
    assert by_topic(out["m-1"]) == {t: [2, 3] for t in TOPICS}
    assert by_topic(out["zz-stranger"]) == {t: [4, 5] for t in TOPICS}
    the_map = ClusterMap.from_bytes(out["zz-stranger"].user_data)
    assert the_map.workers == {"w-a": "http://w-a:8000", "m-2": "", "zz-stranger": ""}


def test_a_member_gets_only_the_topics_it_subscribes_to_and_only_partitions_they_have():
    cluster = FakeCluster({TOPICS[0]: 4, TOPICS[1]: 2})
    members = {"m-1": meta(W["w-a"], TOPICS), "m-2": meta(W["w-b"], TOPICS[:1])}
    out = {m: decoded(a) for m, a in assign(cluster, members, 0).items()}
    assert by_topic(out["m-1"]) == {TOPICS[0]: [0, 1], TOPICS[1]: [0, 1]}
    assert by_topic(out["m-2"]) == {TOPICS[0]: [2, 3]}


def test_an_unknown_topic_assigns_nothing_of_it():
    cluster = FakeCluster({TOPICS[0]: 2})
    members = {"m-1": meta(W["w-a"], ("missing", TOPICS[0]))}
    out = decoded(assign(cluster, members, 0)["m-1"])
    assert by_topic(out) == {"missing": [], TOPICS[0]: [0, 1]}


# --- the assignor class --------------------------------------------------------------------

def test_the_assignor_announces_its_worker_and_hands_over_the_map():
    seen: list[ClusterMap] = []
    assignor = assignor_for(W["w-b"], 1, seen.append)
    assert assignor.name == ASSIGNOR_NAME
    metadata = ConsumerProtocolMemberMetadata.decode(assignor.metadata(set(TOPICS)).encode())
    assert sorted(metadata.subscription) == sorted(TOPICS)
    assert json.loads(metadata.user_data) == {"worker": "w-b", "url": "http://w-b:8000",
                                              "single": False, "since": 0.0}

    cluster = FakeCluster({TOPICS[0]: 4, TOPICS[1]: 4})
    other = assignor_for(W["w-a"], 1, lambda _: None)
    members = {"m-b": metadata, "m-a": ConsumerProtocolMemberMetadata.decode(
        other.metadata(list(TOPICS)).encode())}
    out = assignor.assign(cluster, members)
    mine = decoded(out["m-b"])
    assignor.on_assignment(mine)
    assert len(seen) == 1
    assert seen[0].owned_by("w-b") == {2, 3} and seen[0].owned_by("w-a") == {0, 1}
    assert seen[0].standby_of("w-b") == {0, 1}
    assert {p.partition for p in mine.partitions()} == {2, 3}


def test_an_assignment_without_a_map_or_with_a_bad_one_is_not_handed_over():
    seen: list[ClusterMap] = []
    assignor = assignor_for(W["w-a"], None, seen.append)
    assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [(TOPICS[0], [0])], b""))
    assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [(TOPICS[0], [0])], b"{}"))
    assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [(TOPICS[0], [0])], b"junk"))
    assert seen == []


# --- Cluster -------------------------------------------------------------------------------

def test_the_cluster_keeps_each_stage_map_and_routes_by_apply_first():
    cluster = Cluster(worker_of("w-a", "http://w-a:8000"))
    heard: list[tuple[str, ClusterMap]] = []
    cluster.listeners.append(lambda stage, m: heard.append((stage, m)))
    assert cluster.routing() is None
    ingest = plan(workers("w-a"), range(2), 0)
    cluster.update("ingest", ingest)
    assert cluster.routing() is ingest
    apply = plan(workers("w-a", "w-b"), range(2), 0)
    cluster.update("apply", apply)
    assert cluster.routing() is apply
    assert cluster.routing(("ingest",)) is ingest
    assert heard == [("ingest", ingest), ("apply", apply)]


def test_a_worker_without_an_instance_id_gets_a_random_one():
    a, b = worker_of("", "u"), worker_of("", "u")
    assert a.worker_id.startswith("anon-") and a.worker_id != b.worker_id
    assert worker_of("w-9", "http://x").worker_id == "w-9"
