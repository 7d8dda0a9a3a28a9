"""``memstream rebuild`` on the partitioned layout (the default): each partition's shard
rebuilt from the topics the way a worker restores it, verified, and adopted by the worker.

Per partition *p*: a new shard is folded from the memory-change, job-result and
memory-access topics of *p* up to their ends now (:func:`streams.shard_restore.restore`, the
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

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import click

from memstream.core.settings import Settings
from memstream.memory.store import MemoryStore, StoreError, checksum
from memstream.memory.store.partitioned import SHARDS_DIR
from memstream.streams.shard_builders import (
    BuilderFailed,
    Rebuilt,
    build_shards,
    open_edge_shard,
    shares,
)

RUNNING = ("the shards under {root} are open in a running worker ({error}): a shard is "
           "rebuilt with its worker stopped — stop it and run `memstream rebuild` again (a "
           "worker also restores a shard from the memory-change topic by itself when "
           "{root}/<partition> is removed while it is stopped)")


@dataclass
class ShardsRebuilt:
    """What ``rebuild_partitioned`` did: the verdict of each partition that had a live
    shard to compare with (user by user, record for record)."""

    ok: bool  # every compared shard equal (True when nothing was compared)
    shards: int = 0
    changes: int = 0
    verdicts: dict[int, checksum.Verification] = field(default_factory=dict)

    def verdict(self) -> checksum.Verification:
        """The partitions' verdicts as one (a user lives in one partition)."""
        found = list(self.verdicts.values())
        return checksum.Verification(
            users=sum(v.users for v in found), equal=sum(v.equal for v in found),
            differ=sorted(k for v in found for k in v.differ),
            only_live=sorted(k for v in found for k in v.only_live),
            only_rebuilt=sorted(k for v in found for k in v.only_rebuilt))


def verdict_line(v: checksum.Verification, shards: int) -> str:
    """``N users compared in S shards: E equal, D differing`` (and the one-sided users)."""
    line = (f"{v.users} user{'s' * (v.users != 1)} compared in {shards} "
            f"shard{'s' * (shards != 1)}: {v.equal} equal, {len(v.differ)} differing")
    if v.only_live or v.only_rebuilt:
        line += (f", {len(v.only_live)} only in the live shards, {len(v.only_rebuilt)} only "
                 "in the rebuilt ones")
    shown = [f"{t}/{u}" for t, u in (v.differ + v.only_live + v.only_rebuilt)[:5]]
    return line + (f" (e.g. {', '.join(shown)})" if shown else "")


def _verify(live: MemoryStore, new: MemoryStore) -> checksum.Verification:
    return checksum.compare(checksum.digests(live.scan(vectors=True)),
                            checksum.digests(new.scan(vectors=True)))


def _live_shards(settings: Settings, dim: int) -> dict[int, MemoryStore]:
    """The worker's shards that exist, opened here (refused while a worker holds them)."""
    root = settings.data_dir / SHARDS_DIR
    opened: dict[int, MemoryStore] = {}
    try:
        for partition in range(settings.partitions):
            if (root / str(partition) / "shard").exists():
                opened[partition] = open_edge_shard(root / str(partition), dim)
    except StoreError as exc:
        for store in opened.values():
            store.close()
        raise click.ClickException(RUNNING.format(root=root, error=exc)) from exc
    return opened


def rebuild_partitioned(settings: Settings, into: Path | None, *, verify: bool, swap: bool,
                        force: bool, keep: bool,
                        echo: Callable[[str], None] = click.echo) -> ShardsRebuilt:
    """See the module doc; prints what it did (through ``echo``), returns the verdicts
    (``ok``: every shard verified)."""
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
        try:
            built = build_shards(settings, into, dim)
        except BuilderFailed as exc:
            raise click.ClickException(str(exc)) from exc
        for done in built:
            shards.append(open_edge_shard(done.path, dim))
        result = ShardsRebuilt(ok=True, shards=len(built), changes=sum(d.changes for d in built))
        for done, shard in zip(built, shards, strict=True):
            if (verify or swap) and done.partition in live:
                done.verdict = _verify(live[done.partition], shard)
                result.verdicts[done.partition] = done.verdict
                result.ok = result.ok and done.verdict.ok
            echo(f"partition {done.partition}: {done.changes} changes; "
                 + ("no live shard" if done.verdict is None else done.verdict.summary()))
    except BaseException:
        for store in [*shards, *live.values()]:
            store.close()
        shutil.rmtree(into, ignore_errors=True)  # no partial copy of users' memories left
        raise
    for store in [*shards, *live.values()]:
        store.close()
    seconds = time.perf_counter() - started
    changes = result.changes
    echo(f"rebuilt {len(built)} shards into {into}: {changes} changes, {seconds:.2f} s "
         f"({changes / max(seconds, 1e-9):,.0f} changes/s, "
         f"{len(shares(settings.partitions, settings.rebuild_processes))} processes)")
    if result.verdicts:
        echo(("verified: " if result.ok else "MISMATCH: ")
             + verdict_line(result.verdict(), len(result.verdicts)))
    if swap and (result.ok or force):
        files = ShardFiles(root, settings.erasure_bound_s)
        now = time.time()
        for done in built:
            files.wipe(done.partition)
            root.mkdir(parents=True, exist_ok=True)
            shutil.move(str(done.path), str(files.path(done.partition)))
            files.write_checkpoint(done.partition, done.offsets, now)
        files.wipe("global")  # read again from the global-changes topic at start
        shutil.rmtree(into, ignore_errors=True)
        echo(f"swapped: {len(built)} shards in {root}, each with the offsets it holds; "
             "the worker adopts them at its next start")
    elif keep:
        echo(f"kept the rebuilt shards in {into}")
    else:
        shutil.rmtree(into, ignore_errors=True)
        echo(f"deleted the rebuilt shards ({into}): nothing swapped" if swap else
             "deleted the rebuilt shards (verified only)")
    return result
