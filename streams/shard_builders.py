"""Shards built from the topics in processes of their own, side by side: ``memstream
rebuild`` (every partition's shard, :func:`build_shards`) and a worker that restores a
partition in full (:class:`ShardBuilders`). The Qdrant Edge binding holds the GIL while it
writes, so threads do not build in parallel; processes do, each a shard of its own.

A builder folds a partition's memory-change, job-result and memory-access topics to their
ends now into a fresh shard (:func:`streams.shard_restore.restore`, the worker's own restore),
closes it and returns the offsets it holds. A builder dies with the process that started it
(Linux), so no builder goes on writing a copy of users' memories that nobody will delete.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path

from memstream.core.errors import MemstreamError, describe
from memstream.core.settings import Settings
from memstream.memory.store import MemoryStore, checksum
from memstream.memory.store.rebuild_fold import Opener
from memstream.streams.shard_restore import restore


@dataclass
class Rebuilt:
    """One partition's rebuilt shard: where, what it holds, how it compares."""

    partition: int
    path: Path
    offsets: dict[str, int]
    changes: int
    verdict: checksum.Verification | None  # None: no live shard to compare with


def open_edge_shard(path: Path, dim: int) -> MemoryStore:
    from memstream.memory.store.edge import EdgeStore

    return EdgeStore(path, dim)


async def _rebuild_one(settings: Settings, partition: int, into: Path, dim: int,
                       topics: list[str], opener: Opener | None) -> Rebuilt:
    """``into/<partition>`` folded from the topics, closed (whether or not it is whole)."""
    shard = open_edge_shard(into / str(partition), dim)
    try:
        offsets, job = await restore(settings, topics, partition, shard, opener, None)
    finally:
        shard.close()
    return Rebuilt(partition, into / str(partition), offsets, job.changes, None)


async def _build(settings: Settings, into: Path, dim: int,
                 partitions: list[int]) -> list[Rebuilt]:
    """Build ``partitions``' shards one after another, each closed once built."""
    from memstream.memory.store.rebuild_topics import opener_for
    from memstream.topics.registry import registry

    reg = registry(settings)
    topics = [reg.memory_changes.name, reg.job_results.name, reg.memory_access.name]
    opener, keys = await opener_for(settings, reg.user_keys.name)
    built: list[Rebuilt] = []
    try:
        for partition in partitions:
            built.append(await _rebuild_one(settings, partition, into, dim, topics, opener))
    finally:
        if keys is not None:
            await keys.stop()
    return built


def _build_in_process(settings: Settings, into: Path, dim: int,
                      partitions: list[int]) -> list[Rebuilt]:
    return asyncio.run(_build(settings, into, dim, partitions))


class BuilderFailed(MemstreamError):
    """A builder's error as text naming its partitions (any error crosses back to the
    command so: not every exception can be pickled)."""


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(parent: int) -> None:
    """Have the kernel kill this builder when the command that started it dies (Linux), so
    no builder goes on writing a copy of users' memories that nobody will delete."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # a Ctrl-C or a service manager's SIGTERM to the whole group is the parent's to handle:
    # it stops its builders itself (or they die with it)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.getppid() != parent:  # it died before that
        os._exit(1)


def _builder(settings: Settings, into: Path, dim: int, partitions: list[int],
             parent: int) -> list[Rebuilt]:
    """One builder process's share (a process pool's task: picklable in and out)."""
    _die_with(parent)
    try:
        return _build_in_process(settings, into, dim, partitions)
    except BaseException as exc:
        raise BuilderFailed(f"the builder of partitions {partitions}: {describe(exc)}") from None


AUTO_CAP = 8  # builders when rebuild_processes is 0: each holds a Python and a shard
STAGING_SUFFIX = ".build"  # a worker's builder builds partition p in root/<p>.build first


def cores() -> int:
    """The CPUs this process may run on (a container's cpuset, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def builders_for(partitions: int, processes: int) -> int:
    """How many builders ``processes`` means (0: one per CPU this process may use, at most
    ``AUTO_CAP``): at least one, never more than the partitions."""
    return max(1, min(processes or min(cores(), AUTO_CAP), partitions))


def shares(partitions: int, processes: int) -> list[list[int]]:
    """The partitions dealt round-robin to :func:`builders_for` builders, none empty."""
    n = builders_for(partitions, processes)
    return [list(range(partitions))[i::n] for i in range(n)]


def build_shards(settings: Settings, into: Path, dim: int,
                 processes: int | None = None) -> list[Rebuilt]:
    """Every partition's shard built into ``into/<p>`` and closed, by
    ``settings.rebuild_processes`` processes side by side (or ``processes``); in this
    process when one is enough. The first builder error stops the other builders and is
    raised here (:class:`BuilderFailed`); a builder dies with this process."""
    groups = shares(settings.partitions,
                    settings.rebuild_processes if processes is None else processes)
    if len(groups) == 1:
        return _build_in_process(settings, into, dim, groups[0])
    # spawned, not forked: a fork would copy this process's threads and event loop state
    with ProcessPoolExecutor(len(groups), mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_builder, settings, into, dim, g, os.getpid()) for g in groups]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        if any(f.exception() is not None for f in done):
            # the rest of the rebuild is void: stop the other builders now instead of
            # letting them finish their shares
            _kill_processes(pool)
    errors = [e for f in futures if (e := f.exception()) is not None]
    own = [e for e in errors if not isinstance(e, BrokenProcessPool)]
    if own:
        raise own[0]
    if errors:
        raise BuilderFailed("a builder process died (killed, or out of memory?); "
                            "MEMSTREAM_REBUILD_PROCESSES=1 builds every shard in this process")
    return sorted((done for f in futures for done in f.result()),
                  key=lambda done: done.partition)


def _kill_processes(pool: ProcessPoolExecutor) -> None:
    """SIGKILL the pool's processes (none left after its shutdown: nothing to do)."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            process.kill()


class ShardBuilders:
    """A worker's builder processes: a partition's shard restored in full in one of them,
    at most ``processes`` at once (their GILs their own: the worker goes on serving its
    other partitions meanwhile). The pool is started by the first build and stopped when
    the last one in flight ends, so no idle Python is kept. A builder builds partition p in
    ``<p>.build`` and the shard is moved to ``<p>`` once whole. A build cancelled (the worker
    stopping) kills the builders; what they leave in ``<p>.build`` is wiped by the next take
    of p (:meth:`streams.shards.ShardFiles.wipe`)."""

    def __init__(self, settings: Settings, dim: int, processes: int) -> None:
        self.settings = settings
        self.dim = dim
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._inflight = 0

    async def build(self, partition: int, root: Path) -> Rebuilt:
        """``root/<partition>`` built from the topics (in ``root/<partition>.build``, moved
        there once whole: a builder that failed, perhaps still writing, never shares a
        directory with the shard restored in its place); raises :class:`BuilderFailed` (a
        builder's error, or its process died), or CancelledError."""
        staging = root / f"{partition}{STAGING_SUFFIX}"
        shutil.rmtree(staging, ignore_errors=True)  # a killed builder's leftovers
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.processes, mp_context=get_context("spawn"))
        pool = self._pool
        self._inflight += 1
        try:
            try:
                [done] = await asyncio.get_running_loop().run_in_executor(
                    pool, _builder, self.settings, staging, self.dim, [partition], os.getpid())
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # the pool shut down under it (another build was cancelled): no cancel of ours
                raise BuilderFailed(f"the builder of partition {partition} was stopped"
                                    ) from None
            except BrokenProcessPool:
                if self._pool is pool:
                    self._pool = None  # the next build gets a new pool
                raise BuilderFailed(f"the builder of partition {partition} died (killed, or "
                                    "out of memory?)") from None
            shutil.rmtree(root / str(partition), ignore_errors=True)
            (staging / str(partition)).rename(root / str(partition))
            shutil.rmtree(staging, ignore_errors=True)
            return replace(done, path=root / str(partition))
        except asyncio.CancelledError:
            self._kill(pool)
            raise
        finally:
            self._inflight -= 1
            if self._inflight == 0 and self._pool is not None:
                idle, self._pool = self._pool, None
                idle.shutdown(wait=False, cancel_futures=True)

    def _kill(self, pool: ProcessPoolExecutor) -> None:
        """The builders stopped at once (the worker is stopping); safe to call again."""
        _kill_processes(pool)
        if self._pool is pool:
            self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)


def worker_builders(settings: Settings, dim: int) -> ShardBuilders | None:
    """The builders a worker restores with: ``rebuild_processes`` of them (0: one per CPU
    it may use, at most ``AUTO_CAP``); None when that is one (restores in the worker's own
    process) or the worker has a single partition."""
    n = builders_for(settings.partitions, settings.rebuild_processes)
    return ShardBuilders(settings, dim, n) if n > 1 else None
