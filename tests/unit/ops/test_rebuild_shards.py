"""How ``memstream rebuild`` deals the partitions' shards to its builder processes."""

from __future__ import annotations

import os

import pytest

from memstream.ops.rebuild_shards import AUTO_CAP, cores, shares

pytestmark = pytest.mark.unit


def test_every_partition_goes_to_exactly_one_builder():
    for partitions in (1, 2, 4, 7, 12):
        for processes in (1, 2, 3, 5, 16):
            groups = shares(partitions, processes)
            dealt = sorted(p for g in groups for p in g)
            assert dealt == list(range(partitions))
            assert all(groups), groups  # no idle builder
            assert len(groups) == min(processes, partitions)


def test_partitions_are_dealt_round_robin_so_builders_get_equal_shares():
    assert shares(5, 2) == [[0, 2, 4], [1, 3]]
    assert max(map(len, shares(12, 5))) - min(map(len, shares(12, 5))) <= 1


def test_zero_processes_means_one_per_usable_core_capped_never_more_than_the_partitions():
    usable = len(os.sched_getaffinity(0))
    assert len(shares(64, 0)) == min(usable, AUTO_CAP)
    assert len(shares(1, 0)) == 1
    assert cores() == usable
