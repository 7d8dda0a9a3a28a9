"""``memstream rebuild`` on the partitioned layout (the default): each partition's shard
rebuilt from the topics the way a worker restores it, verified, and adopted by the worker.

Per partition *p*: a new shard is folded from the memory-change, job-result and
memory-access topics of *p* up to their ends now (:func:`streams.shards.restore`, the
worker's own restore) and compared user by user with ``data_dir/store/<p>`` (checksums of
every record). ``--swap`` (verified, or ``--force``) puts each rebuilt shard in place of
the live one with a checkpoint naming the offsets it holds: the worker adopts it at its
next start (it catches up from there, as after a clean stop). A rebuilt copy that is not
swapped in is deleted (``--keep`` keeps it), so no copy of users' memories outlives a
forget-me out of its reach. The shards are built by ``rebuild_processes`` processes side by
side (default one per CPU it may use, at most 8), each a share of the partitions: the
Qdrant Edge binding holds the GIL while it writes, so only processes build in parallel.

The shards belong to a worker's process: run the command on the worker's host, with the
worker stopped (a running worker holds its shards' write-ahead logs; it is refused in one
line; a build alone, ``--no-verify`` without ``--swap``, reads only the topics). A shard
with no checkpoint is restored by the worker itself when it takes the partition, so
removing ``data_dir/store/<p>`` of a stopped worker rebuilds it too. The
global memories' copy (``data_dir/store/global``) is dropped on a swap and read again at
start. Re-embedding (``--embedder``) and partial rebuilds are refused here: a shard restores
whole, from the vectors its change events carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import multiprocessing
import os
import shutil
import signal
import time
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path

import click

from memstream.core.errors import describe
from memstream.core.settings import Settings
from memstream.memory.store import MemoryStore, StoreError, checksum
from memstream.memory.store.partitioned import SHARDS_DIR
from memstream.memory.store.rebuild_fold import Opener

RUNNING = ("the shards under {root} are open in a running worker ({error}): a shard is "
           "rebuilt with its worker stopped — stop it and run `memstream rebuild` again (a "
           "worker also restores a shard from the memory-change topic by itself when "
           "{root}/<partition> is removed while it is stopped)")


@dataclass
class Rebuilt:
    """One partition's rebuilt shard: where, what it holds, how it compares."""

    partition: int
    path: Path
    offsets: dict[str, int]
    changes: int
    verdict: checksum.Verification | None  # None: no live shard to compare with


def _open(path: Path, dim: int) -> MemoryStore:
    from memstream.memory.store.edge import EdgeStore

    return EdgeStore(path, dim)


async def _rebuild_one(settings: Settings, partition: int, into: Path, dim: int,
                       topics: list[str], opener: Opener | None) -> tuple[MemoryStore, Rebuilt]:
    from memstream.streams.shards import restore

    shard = _open(into / str(partition), dim)
    offsets, job = await restore(settings, topics, partition, shard, opener, None)
    return shard, Rebuilt(partition, into / str(partition), offsets, job.changes, None)


def _verify(live: MemoryStore, new: MemoryStore) -> checksum.Verification:
    return checksum.compare(checksum.digests(live.scan(vectors=True)),
                            checksum.digests(new.scan(vectors=True)))


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
            shard, done = await _rebuild_one(settings, partition, into, dim, topics, opener)
            shard.close()
            built.append(done)
    finally:
        if keys is not None:
            await keys.stop()
    return built


def _build_in_process(settings: Settings, into: Path, dim: int,
                      partitions: list[int]) -> list[Rebuilt]:
    return asyncio.run(_build(settings, into, dim, partitions))


class BuilderFailed(click.ClickException):
    """A builder's error as text naming its partitions (any error crosses back to the
    command so: not every exception can be pickled)."""


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(parent: int) -> None:
    """Have the kernel kill this builder when the command that started it dies (Linux), so
    no builder goes on writing a copy of users' memories that nobody will delete."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
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


def cores() -> int:
    """The CPUs this process may run on (a container's cpuset, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def shares(partitions: int, processes: int) -> list[list[int]]:
    """The partitions dealt round-robin to at most ``processes`` builders (0: one per CPU
    this process may use, at most ``AUTO_CAP``), none empty."""
    n = processes or min(cores(), AUTO_CAP)
    n = max(1, min(n, partitions))
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
            # the rest of the rebuild is void: stop the other builders now (this command's
            # only multiprocessing children) instead of letting them finish their shares
            for child in multiprocessing.active_children():
                child.kill()
    errors = [e for f in futures if (e := f.exception()) is not None]
    own = [e for e in errors if not isinstance(e, BrokenProcessPool)]
    if own:
        raise own[0]
    if errors:
        raise BuilderFailed("a builder process died (killed, or out of memory?); "
                            "MEMSTREAM_REBUILD_PROCESSES=1 builds every shard in this process")
    return sorted((done for f in futures for done in f.result()),
                  key=lambda done: done.partition)


def _live_shards(settings: Settings, dim: int) -> dict[int, MemoryStore]:
    """The worker's shards that exist, opened here (refused while a worker holds them)."""
    root = settings.data_dir / SHARDS_DIR
    opened: dict[int, MemoryStore] = {}
    try:
        for partition in range(settings.partitions):
            if (root / str(partition) / "shard").exists():
                opened[partition] = _open(root / str(partition), dim)
    except StoreError as exc:
        for store in opened.values():
            store.close()
        raise click.ClickException(RUNNING.format(root=root, error=exc)) from exc
    return opened


def rebuild_partitioned(settings: Settings, into: Path | None, *, verify: bool, swap: bool,
                        force: bool, keep: bool) -> bool:
    """See the module doc; prints what it did, returns whether every shard verified."""
    from memstream.memory.services import build_embedder
    from memstream.streams.shards import ShardFiles

    dim = build_embedder(settings).dim
    root = settings.data_dir / SHARDS_DIR
    # first: refused before anything is written (a build alone, --no-verify without --swap,
    # reads only the topics: it runs beside the worker)
    live = _live_shards(settings, dim) if verify or swap else {}
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    into = into or settings.data_dir / "stores" / f"rebuild-{stamp}"
    if into.exists() and any(into.iterdir()):
        for store in live.values():
            store.close()
        raise click.UsageError(f"{into} is not empty: give a new --into")
    started = time.perf_counter()
    built: list[Rebuilt] = []
    shards: list[MemoryStore] = []
    try:
        built = build_shards(settings, into, dim)
        for done in built:
            shards.append(_open(done.path, dim))
        ok = True
        for done, shard in zip(built, shards, strict=True):
            if (verify or swap) and done.partition in live:
                done.verdict = _verify(live[done.partition], shard)
                ok = ok and done.verdict.ok
            click.echo(f"partition {done.partition}: {done.changes} changes; "
                       + ("no live shard" if done.verdict is None else done.verdict.summary()))
    except BaseException:
        for store in [*shards, *live.values()]:
            store.close()
        shutil.rmtree(into, ignore_errors=True)  # no partial copy of users' memories left
        raise
    for store in [*shards, *live.values()]:
        store.close()
    seconds = time.perf_counter() - started
    changes = sum(d.changes for d in built)
    click.echo(f"rebuilt {len(built)} shards into {into}: {changes} changes, {seconds:.2f} s "
               f"({changes / max(seconds, 1e-9):,.0f} changes/s, "
               f"{len(shares(settings.partitions, settings.rebuild_processes))} processes)")
    if swap and (ok or force):
        files = ShardFiles(root, settings.erasure_bound_s)
        now = time.time()
        for done in built:
            files.wipe(done.partition)
            root.mkdir(parents=True, exist_ok=True)
            shutil.move(str(done.path), str(files.path(done.partition)))
            files.write_checkpoint(done.partition, done.offsets, now)
        files.wipe("global")  # read again from the global-changes topic at start
        shutil.rmtree(into, ignore_errors=True)
        click.echo(f"swapped: {len(built)} shards in {root}, each with the offsets it holds; "
                   "the worker adopts them at its next start")
    elif keep:
        click.echo(f"kept the rebuilt shards in {into}")
    else:
        shutil.rmtree(into, ignore_errors=True)
        click.echo(f"deleted the rebuilt shards ({into}): nothing swapped" if swap else
                   "deleted the rebuilt shards (verified only)")
    return ok
