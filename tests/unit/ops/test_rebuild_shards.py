"""How ``memstream rebuild`` deals the partitions' shards to its builder processes."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
from pathlib import Path

import pytest

from memstream.core.settings import Settings
from memstream.streams import shard_builders
from memstream.streams.shard_builders import (
    AUTO_CAP,
    BuilderFailed,
    build_shards,
    cores,
    shares,
)

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

    monkeypatch.setattr(shard_builders, "_build_in_process", failing)
    monkeypatch.setattr(shard_builders, "_die_with", lambda parent: None)
    with pytest.raises(BuilderFailed) as raised:
        shard_builders._builder(Settings(), Path("unused"), 8, [3, 5], os.getpid())
    copy = pickle.loads(pickle.dumps(raised.value))
    assert "partitions [3, 5]" in str(copy) and "Unpicklable" in str(copy)


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting to be reaped (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped before, or while, it was read
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_a_worker_restores_in_builders_only_when_more_than_one_may_run():
    from memstream.streams.shard_builders import worker_builders

    assert worker_builders(Settings(partitions=4, rebuild_processes=1), 8) is None
    assert worker_builders(Settings(partitions=1, rebuild_processes=4), 8) is None
    assert worker_builders(Settings(partitions=4, rebuild_processes=3), 8).processes == 3
    assert worker_builders(Settings(partitions=2, rebuild_processes=6), 8).processes == 2
    auto = worker_builders(Settings(partitions=64, rebuild_processes=0), 8)
    assert (auto.processes if auto else 1) == min(cores(), AUTO_CAP)


async def test_cancelled_builds_kill_their_builders_and_a_failed_one_says_which(tmp_path):
    """Real builder processes: the worker stopping (two takes cancelled together) kills
    them at once, whatever they wait on, and each take ends cancelled (never a restore in
    the worker instead); a builder that cannot build raises BuilderFailed naming its
    partition, and its unfinished copy never takes the shard's place."""
    import asyncio

    from memstream.streams.shard_builders import ShardBuilders

    # nothing listens there: the builders wait on the broker until they are killed
    settings = Settings(partitions=2, bootstrap_servers="127.0.0.1:9", topic_prefix="nowhere")
    builders = ShardBuilders(settings, 8, 2)
    root = tmp_path / "store"
    builds = [asyncio.ensure_future(builders.build(n, root)) for n in (0, 1)]
    while builders._pool is None or len(getattr(builders._pool, "_processes", None) or {}) < 2:
        await asyncio.sleep(0.05)
    pids = [process.pid for process in builders._pool._processes.values()]
    for build in builds:
        build.cancel()
    for build in builds:
        with pytest.raises(asyncio.CancelledError):
            await build
    deadline = time.monotonic() + 10  # killed, then reaped by the pool's own thread
    while not all(map(_dead, pids)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert all(map(_dead, pids)), pids
    assert builders._pool is None  # no idle pool kept

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(BuilderFailed, match=r"the builder of partitions \[0\]"):
        await ShardBuilders(Settings(partitions=2), 8, 2).build(0, blocker / "store")
