"""One worker per single store, never two answering from stores that each hold a part
(streams/store_layout.py, streams/cluster.py ``must_leave``, streams/scaling.py)."""

from __future__ import annotations

import pytest

from memstream.core.settings import Settings
from memstream.streams.cluster import ClusterMap, Worker, assign, must_leave, plan
from memstream.streams.scaling import _alone
from memstream.streams.store_layout import EXIT_SHARED, data_dir_conflict, single_layout

pytestmark = pytest.mark.unit


def test_the_partitioned_layout_is_the_default():
    assert Settings().store_partitioned and not single_layout(Settings())
    assert single_layout(Settings(store_partitioned=False))
    assert not single_layout(Settings(store_partitioned=False, store="server"))


def the_map(*workers: Worker) -> ClusterMap:
    return plan(workers, range(4), None, 0.0)


OLD, NEW = 100.0, 200.0


@pytest.mark.parametrize(("me", "others", "leaves"), [
    (Worker("a", "", single=True, since=NEW), [Worker("b", "", single=True, since=OLD)], {"b"}),
    (Worker("a", "", single=True, since=OLD), [Worker("b", "", single=True, since=NEW)], set()),
    # beside a partitioned worker (which never leaves), a single-layout one always does
    (Worker("a", "", single=True, since=OLD), [Worker("b", "", since=NEW)], {"b"}),
    (Worker("a", "", since=NEW), [Worker("b", "", single=True, since=OLD)], set()),
    (Worker("a", "", single=True, since=OLD), [], set()),  # alone
    # the same start time: the worker id decides, the same way on both
    (Worker("b", "", single=True, since=OLD), [Worker("a", "", single=True, since=OLD)], {"a"}),
    (Worker("a", "", single=True, since=OLD), [Worker("b", "", single=True, since=OLD)], set()),
], ids=["newer-leaves", "older-stays", "beside-partitioned", "partitioned-stays", "alone",
        "tie-b", "tie-a"])
def test_of_two_single_layout_workers_the_newer_leaves(me, others, leaves):
    assert must_leave(the_map(me, *others), me) == leaves


def test_the_map_carries_each_workers_layout_through_the_group_protocol():
    class Meta:
        def __init__(self, w: Worker) -> None:
            import json
            self.user_data = json.dumps({"worker": w.worker_id, "url": w.url,
                                         "single": w.single, "since": w.since}).encode()
            self.subscription = ["t"]

    class Cluster:
        @staticmethod
        def partitions_for_topic(topic: str) -> set[int]:
            return {0, 1}

    members = {"m1": Meta(Worker("a", "u", single=True, since=OLD)),
               "m2": Meta(Worker("b", "u", since=NEW))}
    out = assign(Cluster(), members, None)
    sent = ClusterMap.from_bytes(out["m1"].user_data)
    assert sent.single == {"a": OLD}
    assert must_leave(sent, Worker("a", "u", single=True, since=OLD)) == {"b"}


def test_a_single_layout_worker_ends_itself_before_taking_a_shared_assignment():
    ended: list[tuple[str, int]] = []
    me = Worker("w-new", "", single=True, since=NEW)
    watch = _alone(me, end=lambda reason, code: ended.append((reason, code)))
    watch("apply", the_map(me))
    assert ended == []
    watch("apply", the_map(me, Worker("w-old", "", single=True, since=OLD)))
    assert len(ended) == 1 and ended[0][1] == EXIT_SHARED
    assert "MEMSTREAM_STORE_PARTITIONED=true" in ended[0][0] and "w-old" in ended[0][0]
    assert "\n" not in ended[0][0]


def test_a_data_dir_of_the_other_layout_is_refused_and_left_as_it_is(tmp_path):
    partitioned = Settings(data_dir=tmp_path)
    single = Settings(data_dir=tmp_path, store_partitioned=False)
    assert data_dir_conflict(partitioned) is None and data_dir_conflict(single) is None
    (tmp_path / "qdrant").mkdir()
    line = data_dir_conflict(partitioned)
    assert line is not None and "MEMSTREAM_STORE_PARTITIONED=false" in line and "\n" not in line
    assert (tmp_path / "qdrant").is_dir()  # never deleted for the operator
    assert data_dir_conflict(single) is None
    (tmp_path / "store" / "0").mkdir(parents=True)
    line = data_dir_conflict(single)
    assert line is not None and "MEMSTREAM_STORE_PARTITIONED=true" in line
    assert data_dir_conflict(Settings(data_dir=tmp_path, store="server",
                                      qdrant_url="http://q")) is None


def test_a_data_dir_with_shards_beyond_the_partition_count_is_refused(tmp_path):
    """Shards of another topic set's count (after `memstream topics grow` to fewer
    partitions, or a data dir reused across deployments): their users sit elsewhere."""
    for p in (0, 1, 2, 3):
        (tmp_path / "store" / str(p)).mkdir(parents=True)
    (tmp_path / "store" / "global").mkdir()
    assert data_dir_conflict(Settings(data_dir=tmp_path, partitions=4)) is None
    assert data_dir_conflict(Settings(data_dir=tmp_path, partitions=8)) is None  # restored
    line = data_dir_conflict(Settings(data_dir=tmp_path, partitions=2))
    assert line is not None and "partitions 2, 3" in line and "\n" not in line
    assert "MEMSTREAM_DATA_DIR" in line
    assert (tmp_path / "store" / "3").is_dir()  # never deleted for the operator
