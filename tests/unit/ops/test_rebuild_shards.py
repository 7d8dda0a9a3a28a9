"""How ``memstream rebuild`` deals the partitions' shards to its builder processes."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from pathlib import Path

import pytest

from memstream.core.settings import Settings
from memstream.ops import rebuild_shards
from memstream.ops.rebuild_shards import AUTO_CAP, BuilderFailed, build_shards, cores, shares

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


def test_a_builders_error_reaches_the_command_naming_its_partitions(tmp_path):
    """Real builder processes that cannot open their shards (``into`` lies under a file):
    the command gets one clear error, whatever the builders raised."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    settings = Settings(partitions=2)
    with pytest.raises(BuilderFailed, match=r"the builder of partitions \[[01]\]"):
        build_shards(settings, blocker / "rebuild", 8, processes=2)
    assert multiprocessing.active_children() == []  # every builder stopped


def test_a_builders_error_crosses_the_process_boundary_as_text(monkeypatch):
    class Unpicklable(Exception):
        def __init__(self, a, b):  # pickle calls it with one argument: it cannot
            super().__init__(f"{a} {b}")

    def failing(*args):
        raise Unpicklable("x", "y")

    monkeypatch.setattr(rebuild_shards, "_build_in_process", failing)
    monkeypatch.setattr(rebuild_shards, "_die_with", lambda parent: None)
    with pytest.raises(BuilderFailed) as raised:
        rebuild_shards._builder(Settings(), Path("unused"), 8, [3, 5], os.getpid())
    copy = pickle.loads(pickle.dumps(raised.value))
    assert "partitions [3, 5]" in copy.message and "Unpicklable" in copy.message
