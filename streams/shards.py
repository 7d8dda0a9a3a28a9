"""The store shards' life in a worker (``store_partitioned``): the memory-change topic is
their changelog, as Kafka Streams and Faust tables keep their state.

- **Take** (the apply loop, after its producer fenced the partition's previous owner, before
  any record of it is handled): a standby copy is caught up and promoted; a shard this worker
  left cleanly is caught up from its checkpoint (the topics' offsets it holds, written when
  it was closed); anything else is wiped and restored from the beginning. A restore folds,
  for the partition, the memory-change topic (:class:`memory.store.rebuild_fold.Fold` into an empty
  shard, :func:`memory.applying.apply_change` onto a caught-up one), then the job results (the
  user's cursor: a job that changed nothing leaves no change event, yet fences its seq), then
  the hit statistics of the memory-access topic, all ``read_committed`` to the ends as they
  are after the fence.
  A full restore of a long log runs in a builder process of its own
  (:mod:`streams.shard_builders`, ``rebuild_processes``, ``restore_in_process_below``): the
  shard it builds is then caught up here from the offsets it holds, like a checkpoint's.
- **Release** (revoked): a partition the new map names this worker a standby of keeps its
  shard as the standby, followed from the offsets it holds (a join's moved partitions are
  then read from the old owner while the new one restores them); any other is closed and
  deleted — a shard nobody follows must not keep what a forget-me erases. On shutdown
  every owned shard is closed with a checkpoint instead, so a restart replays only the
  tail.
- **Standby**: the partitions the cluster map names this worker a standby of are followed
  (:class:`Standbys`); their shards serve reads only when the owner is unreachable.
- **Global**: the tenant-wide memories, from the global-changes topic, in every worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from memstream.core.errors import describe
from memstream.core.topic_reader import end_offsets
from memstream.memory.fencing import Cursor
from memstream.memory.store import MemoryStore
from memstream.memory.store.partitioned import SHARDS_DIR, PartitionedStore
from memstream.streams.shard_builders import (
    STAGING_SUFFIX,
    BuilderFailed,
    Rebuilt,
    ShardBuilders,
)
from memstream.streams.shard_restore import Offsets, Restore, UserKey, restore

__all__ = ["Offsets", "OpenShard", "Restore", "ShardFiles", "ShardKeeper", "UserKey", "restore"]

log = logging.getLogger(__name__)


ENDS_S = 5.0  # reading the access topic's ends as a shard becomes a standby
CLOSE_ENDS_S = 10.0  # ... at shutdown, for the checkpoints
OpenShard = Callable[[Path], MemoryStore]


class ShardFiles:
    """Where a partition's shard and its checkpoint live: ``data_dir/store/<p>`` and
    ``data_dir/store/<p>.checkpoint.json`` (present only while the shard is closed)."""

    def __init__(self, root: Path, erasure_bound_s: float) -> None:
        self.root = root
        self.erasure_bound_s = erasure_bound_s

    def path(self, partition: int | str) -> Path:
        return self.root / str(partition)

    def _checkpoint(self, partition: int | str) -> Path:
        return self.root / f"{partition}.checkpoint.json"

    def checkpoint(self, partition: int | str, now: float,
                   topics: Iterable[str]) -> Offsets | None:
        """The offsets a closed shard holds, if it was closed cleanly within the erasure
        bound (an older copy may hold users forgotten since: it is restored anew) from
        exactly ``topics`` (a shard of another topic set, as after ``memstream topics
        grow``, holds other users: restored anew too)."""
        try:
            raw = json.loads(self._checkpoint(partition).read_text())
            if now - float(raw["at"]) > self.erasure_bound_s:
                return None
            offsets = {str(t): int(o) for t, o in raw["offsets"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # unreadable: restored anew
        return offsets if set(offsets) == set(topics) else None

    def write_checkpoint(self, partition: int | str, offsets: Offsets, now: float) -> None:
        tmp = self._checkpoint(partition).with_suffix(".tmp")
        tmp.write_text(json.dumps({"offsets": offsets, "at": now}))
        tmp.replace(self._checkpoint(partition))

    def drop_checkpoint(self, partition: int | str) -> None:
        self._checkpoint(partition).unlink(missing_ok=True)

    def wipe(self, partition: int | str) -> None:
        """The shard, its checkpoint and a builder's unfinished copy of it gone."""
        self.drop_checkpoint(partition)
        shutil.rmtree(self.path(partition), ignore_errors=True)
        shutil.rmtree(self.root / f"{partition}{STAGING_SUFFIX}", ignore_errors=True)


class ShardKeeper:
    """Opens, restores, checkpoints and closes the owned shards of a :class:`PartitionedStore`
    (see the module doc); the standbys and the global shard are :mod:`streams.standby`'s."""

    def __init__(self, settings: Any, store: PartitionedStore, open_shard: OpenShard,
                 topics: list[str], opener: Callable[[], Any],
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store
        self.open_shard = open_shard
        self.topics = topics
        self.opener = opener  # async: the opener of sealed events once the keys are read
        self.clock = clock
        self.files = ShardFiles(settings.data_dir / SHARDS_DIR, settings.erasure_bound_s)
        self.restoring: dict[int, float] = {}  # partition -> when its restore began
        self.restores: list[tuple[int, int, float]] = []  # partition, changes, seconds
        self.standbys: Any = None  # streams.standby.Standbys, which hands over warm copies
        self.held: dict[int, Offsets] = {}  # owned partition -> the topics' offsets in it
        self.builders: ShardBuilders | None = None  # full restores of long logs (scaling.py)

    async def take(self, partitions: set[int]) -> None:
        """``partitions``' shards restored and owned. A take that fails (the broker away
        half-way, say) leaves nothing behind: the shard it opened closed and wiped (its
        checkpoint is gone already), so taking it again restores it anew."""
        for partition in sorted(partitions - set(self.store.owned)):
            started = time.perf_counter()
            self.restoring[partition] = self.clock()
            shard: MemoryStore | None = None
            try:
                warm = await self.standbys.hand_over(partition) if self.standbys else None
                gathered: dict[UserKey, Cursor] = {}
                built: Rebuilt | None = None  # by a builder process
                if warm is not None:
                    shard, start, gathered = warm
                else:
                    start = self.files.checkpoint(partition, self.clock(), self.topics)
                    if start is None:
                        self.files.wipe(partition)
                        built = await self._built(partition)
                        start = built.offsets if built is not None else None
                    shard = await asyncio.to_thread(self.open_shard, self.files.path(partition))
                self.files.drop_checkpoint(partition)  # open: no longer a clean copy
                done, job = await restore(self.settings, self.topics, partition, shard,
                                          await self.opener(), start, cursors=gathered)
                changes = job.changes + (built.changes if built is not None else 0)
                self.store.owned[partition] = shard
                self.held[partition] = done
            except Exception:  # (a cancelled take may leave a fold thread writing: left)
                if shard is not None:  # (one never opened: the next take wipes its files)
                    await self._discard(partition, shard)
                raise
            finally:
                self.restoring.pop(partition, None)
            seconds = time.perf_counter() - started
            self.restores.append((partition, changes, seconds))
            log.info("shard %d: %s, %d change(s) folded in %.2fs", partition,
                     "promoted" if warm else ("built and caught up" if built is not None
                                              else "caught up" if start else "restored"),
                     changes, seconds)

    async def _discard(self, partition: int, shard: MemoryStore) -> None:
        """A shard whose take failed: closed and wiped (a failure to, only logged: the
        take's own error is the one that counts)."""
        try:
            await asyncio.to_thread(shard.close)
            self.files.wipe(partition)
        except Exception as exc:
            log.warning("shard %d: not discarded after a failed take (%s)", partition,
                        type(exc).__name__)

    async def _built(self, partition: int) -> Rebuilt | None:
        """A full restore of a long log done by a builder process (see
        :mod:`streams.shard_builders`): the shard it built, whose offsets the take then
        catches up from; None: restored here (a short log, no builders, or a builder that
        failed: logged, its copy wiped, and the partition restored in this process
        instead)."""
        if self.builders is None:
            return None
        try:
            ends = await end_offsets(self.settings, self.topics[:1])
        except Exception as exc:  # the restore here reads the topics and says what failed
            log.warning("shard %d: the change log's end not read (%s): restored here",
                        partition, type(exc).__name__)
            return None
        if ends.get(self.topics[0], {}).get(partition, 0) < self.settings.restore_in_process_below:
            return None
        try:
            done = await self.builders.build(partition, self.files.root)
        except BuilderFailed as exc:
            log.warning("shard %d: %s; restored in this process instead", partition,
                        describe(exc))
            self.files.wipe(partition)
            return None
        log.info("shard %d: %d change(s) folded in a builder process", partition, done.changes)
        return done

    def order(self, partitions: set[int]) -> list[int]:
        """The quickest takes first: a warm standby (its tail), then a clean checkpoint
        (the tail since it), then full restores."""
        warm = set(self.store.standby)
        now = self.clock()

        def cost(n: int) -> tuple[int, int]:
            if n in warm:
                return 0, n
            return (1 if self.files.checkpoint(n, now, self.topics) is not None else 2), n

        return sorted(partitions, key=cost)

    def wrote(self, partition: int, offsets: Offsets) -> None:
        """The apply loop committed records of ``partition`` up to these offsets (the
        next after its own last one, per topic): the shard holds them."""
        held = self.held.get(partition)
        if held is not None:
            for topic, offset in offsets.items():
                if topic in self.topics:
                    held[topic] = max(held.get(topic, 0), offset)

    async def release(self, partitions: set[int]) -> None:
        """Given up: kept as a standby when the map names this worker one (from what it
        holds: the restore's ends and this worker's own committed writes since, exact
        even if another worker wrote meanwhile; the hits from the access topic's end now);
        else closed and deleted (a copy nobody follows must not keep what a forget-me
        erases; a standby of it is restored anew)."""
        ends: dict[str, dict[int, int]] | None = None
        for partition in sorted(partitions & set(self.store.owned)):
            shard = self.store.owned.pop(partition)
            held = self.held.pop(partition, None)
            if (held is not None and self.standbys is not None
                    and partition in self.standbys.requested):
                if ends is None:
                    ends = await self._access_ends(ENDS_S)
                if ends:
                    held[self.topics[2]] = ends[self.topics[2]].get(partition, 0)
                    await self.standbys.adopt(partition, shard, held)
                    log.info("shard %d: kept as a standby", partition)
                    continue
            try:
                await asyncio.to_thread(shard.close)
            except Exception as exc:  # its files go next: nothing it held is needed
                log.warning("shard %d: close failed (%s); wiped all the same", partition,
                            describe(exc))
            self.files.wipe(partition)
        if self.standbys is not None:
            self.standbys.refresh()  # a partition it stands by for now

    async def _access_ends(self, timeout_s: float) -> dict[str, dict[int, int]]:
        """The memory-access topic's ends now ({}: the broker is away)."""
        try:
            return await asyncio.wait_for(end_offsets(self.settings, self.topics[2:]),
                                          timeout_s)
        except Exception as exc:  # the broker is away: the shard is restored anew
            log.warning("access ends not read (%s): no standby kept, no checkpoint written",
                        type(exc).__name__)
            return {}

    async def close(self) -> None:
        """Shutdown: every owned shard closed with a checkpoint, so a restart folds only
        the tail. The changes and results it holds are the restore's ends and its own
        committed writes since (the topics' ends could already hold a new owner's records
        if the stop outlasted the session); the hits are the access topic's ends now. With
        the broker away, no checkpoint: the next start restores in full."""
        ends = await self._access_ends(CLOSE_ENDS_S) if self.store.owned else {}
        for partition in sorted(self.store.owned):
            shard = self.store.owned.pop(partition)
            held = self.held.pop(partition, None)
            await asyncio.to_thread(shard.close)
            if ends and held is not None:
                offsets = {**{t: held[t] for t in self.topics[:2]},
                           self.topics[2]: ends[self.topics[2]].get(partition, 0)}
                self.files.write_checkpoint(partition, offsets, self.clock())
