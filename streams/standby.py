"""Standby shards: warm copies of partitions other workers own (``store_standby_replicas``).

The cluster map (:mod:`streams.cluster`) names, per partition, the workers that keep a
standby. This worker restores each of its standby partitions (from its checkpoint when it
has one, else from the beginning) and then follows the partition's memory-change, job-result
and memory-access records (``read_committed``: a standby only ever holds committed data, so
its checkpoint, written every few seconds, is always a clean one). When the partition comes
to this worker, :meth:`Standbys.hand_over` gives the shard and its offsets to the
:class:`~streams.shards.ShardKeeper`, which folds the tail and serves it: a failover costs
the tail, not a full restore. Standby shards answer reads only when the owner is
unreachable (:func:`memory.store.partitioned.standby_reads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka.structs import TopicPartition

from memstream.core.errors import describe
from memstream.core.topic_reader import Record, follow
from memstream.memory.fencing import Cursor
from memstream.memory.store import MemoryStore
from memstream.memory.store.partitioned import PartitionedStore
from memstream.streams.shard_restore import results_check
from memstream.streams.shards import (
    Offsets,
    OpenShard,
    Restore,
    ShardFiles,
    UserKey,
    restore,
)

log = logging.getLogger(__name__)
CHECKPOINT_S = 5.0


class Standbys:
    """Follows the standby partitions into their shards (see the module doc).

    One task: it closes the shards no longer wanted, restores the wanted ones it lacks
    (a restore is never cancelled half-way: its shard would stay open behind a lock), then
    follows them all until the wanted set changes (:meth:`refresh` cancels only the
    following). Every shard is opened, restored, followed, handed over and closed under
    ``lock``, so a partition being taken is never opened twice.
    """

    def __init__(self, settings: Any, store: PartitionedStore, open_shard: OpenShard,
                 topics: list[str], opener: Callable[[], Any], files: ShardFiles,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store
        self.open_shard = open_shard
        self.topics = topics
        self.opener = opener
        self.files = files
        self.clock = clock
        self.requested: set[int] = set()  # the map's standby partitions of this worker
        self.busy: Callable[[], set[int]] = set  # partitions being taken (not to open)
        self.offsets: dict[int, Offsets] = {}
        # the job results' cursors gathered per partition, folded only at the hand-over
        # (a standby's changes may lag its results); the results offset its checkpoint
        # names is the one before them (a restart gathers them again)
        self.cursors: dict[int, dict[UserKey, Cursor]] = {}
        self.durable: dict[int, int] = {}
        self.lock = asyncio.Lock()  # a shard opened, restored, fed or handed over: one at once
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.following: asyncio.Task[None] | None = None
        self.behind: dict[int, bool] = {}
        self.opening: int | None = None  # the partition being restored, under ``lock``

    @property
    def wanted(self) -> set[int]:
        """What is requested and not owned here nor being taken."""
        return self.requested - set(self.store.owned) - self.busy()

    def want(self, partitions: set[int]) -> None:
        """The map changed: follow these partitions (the owned ones are never standbys)."""
        self.requested = set(partitions)
        self.refresh()

    def refresh(self) -> None:
        """Owned partitions or the request changed: the task plans again."""
        self.changed.set()
        if self.following is not None:
            self.following.cancel()
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name="standby-shards")

    async def hand_over(self, partition: int,
                        ) -> tuple[MemoryStore, Offsets, dict[UserKey, Cursor]] | None:
        """The warm shard of ``partition`` and the offsets it holds, no longer followed
        (None: none here; the caller, which marked the partition busy first, restores it).
        It stays requested: given up again (a rebalance during its take), it is followed
        again as the map asks. A partition with no copy here and none being restored is
        answered at once, without waiting for another partition's restore: the caller
        marked it busy, so it will not be opened."""
        if partition not in self.store.standby and self.opening != partition:
            return None
        async with self.lock:
            shard, offsets, cursors = self._forget(partition)
        self.refresh()
        if shard is None or offsets is None:
            return None
        return shard, offsets, cursors

    async def adopt(self, partition: int, shard: MemoryStore, offsets: Offsets) -> None:
        """A shard this worker owned until now becomes its standby: it holds the topics up
        to ``offsets`` and its cursors folded (it was served), and is followed from
        there."""
        async with self.lock:
            self._keep(partition, shard, offsets, {}, offsets.get(self.topics[1], 0))
        self.refresh()

    def _keep(self, partition: int, shard: MemoryStore, offsets: Offsets,
              cursors: dict[UserKey, Cursor], durable: int) -> None:
        """A standby shard, followed from ``offsets`` (under ``lock``)."""
        self.store.standby[partition] = shard
        self.offsets[partition] = dict(offsets)
        self.cursors[partition] = cursors
        self.durable[partition] = durable
        self.behind[partition] = False

    def _forget(self, partition: int,
                ) -> tuple[MemoryStore | None, Offsets | None, dict[UserKey, Cursor]]:
        """A standby shard no longer followed: it and what it holds (under ``lock``)."""
        shard = self.store.standby.pop(partition, None)
        offsets = self.offsets.pop(partition, None)
        cursors = self.cursors.pop(partition, {})
        self.durable.pop(partition, None)
        self.behind.pop(partition, None)
        return shard, offsets, cursors

    async def stop(self) -> None:
        for task in (self.following, self.task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        async with self.lock:
            for partition in list(self.store.standby):
                shard = self.store.standby.pop(partition)
                await asyncio.to_thread(shard.close)
                if partition in self.offsets:
                    self._checkpoint(partition, self.clock())

    async def _run(self) -> None:
        while True:
            self.changed.clear()
            try:
                opener = await self.opener()
                await self._plan(opener)
                if self.changed.is_set():
                    continue
                if not self.store.standby:
                    await self.changed.wait()
                    continue
                self.following = asyncio.create_task(self._follow(opener))
                await asyncio.wait({self.following})
                if not self.following.cancelled() and self.following.exception() is not None:
                    raise self.following.exception()  # type: ignore[misc]
                if not self.changed.is_set():
                    return  # the topics are gone
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("standby shards: %s; again in 2 s", describe(exc))
                await asyncio.sleep(2.0)

    async def _plan(self, opener: Any) -> None:
        """Close what is no longer wanted, restore what is wanted and missing."""
        for partition in sorted(set(self.store.standby) - self.wanted):
            async with self.lock:
                shard, _, _ = self._forget(partition)
                if shard is not None:
                    await asyncio.to_thread(shard.close)
                if partition not in self.store.owned and partition not in self.busy():
                    self.files.wipe(partition)
        for partition in sorted(self.wanted - set(self.store.standby)):
            async with self.lock:
                if partition not in self.wanted:  # taken meanwhile
                    continue
                await self._restore(partition, opener)

    async def _restore(self, partition: int, opener: Any) -> None:
        self.opening = partition  # before any await: hand_over waits for this one
        try:
            await self._restore_shard(partition, opener)
        finally:
            self.opening = None

    async def _restore_shard(self, partition: int, opener: Any) -> None:
        start = self.files.checkpoint(partition, self.clock(), self.topics)
        if start is None:
            self.files.wipe(partition)
        self.files.drop_checkpoint(partition)
        self.behind[partition] = True
        shard = await asyncio.to_thread(self.open_shard, self.files.path(partition))
        try:
            ends, job = await restore(self.settings, self.topics, partition, shard, opener,
                                      start, fold_cursors=False)
        except BaseException:
            await asyncio.to_thread(shard.close)
            self.files.wipe(partition)
            self.behind.pop(partition, None)
            raise
        self._keep(partition, shard, ends, job.cursors, (start or {}).get(self.topics[1], 0))
        log.info("standby shard %d: %s, %d change(s) folded", partition,
                 "caught up" if start else "restored", job.changes)

    def _checkpoint(self, partition: int, now: float) -> None:
        """The offsets the shard holds; the results' offset the one before the cursors it
        has gathered but not folded."""
        offsets = dict(self.offsets[partition])
        offsets[self.topics[1]] = self.durable.get(partition, 0)
        self.files.write_checkpoint(partition, offsets, now)

    async def _follow(self, opener: Any) -> None:
        positions = {TopicPartition(t, p): self.offsets[p][t]
                     for p in self.store.standby for t in self.topics}
        last = self.clock()

        async def handle(records: list[Record]) -> None:
            nonlocal last
            partition, topic = records[0].partition, records[0].topic
            async with self.lock:
                shard = self.store.standby.get(partition)
                if shard is None:
                    return
                job = Restore(shard, opener, empty=False, cursors=self.cursors[partition],
                              authentic=results_check(self.settings))
                step = dict(zip(self.topics, (job.on_changes, job.on_results, job.on_access),
                                strict=True))[topic]

                def apply() -> None:
                    step(records)
                    job.finish(cursors=False)
                    self.cursors[partition] = job.cursors

                applying = asyncio.ensure_future(asyncio.to_thread(apply))
                try:
                    await asyncio.shield(applying)
                except asyncio.CancelledError:  # the batch is applied whole, then we stop
                    await applying
                    self.offsets[partition][topic] = records[-1].offset + 1
                    raise
                self.offsets[partition][topic] = records[-1].offset + 1
                if self.clock() - last >= CHECKPOINT_S:
                    last = self.clock()
                    for p in list(self.offsets):
                        self._checkpoint(p, last)

        await asyncio.gather(*(follow(self.settings, topic, handle, positions={
            tp: o for tp, o in positions.items() if tp.topic == topic},
            partitions={tp.partition for tp in positions if tp.topic == topic})
            for topic in self.topics))


class GlobalCopy:
    """The tenant-wide memories (user ``__global__``) of every tenant, in a shard of their
    own on every worker (``data_dir/store/global``), folded from the global-changes topic
    (``read_committed``, one partition) from its checkpoint on, so every user's search
    includes them whichever worker serves it."""

    NAME = "global"

    def __init__(self, settings: Any, store: PartitionedStore, open_shard: OpenShard,
                 topic: str, opener: Callable[[], Any], files: ShardFiles,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store
        self.open_shard = open_shard
        self.topic = topic
        self.opener = opener
        self.files = files
        self.clock = clock
        self.task: asyncio.Task[None] | None = None
        self.offset = 0
        self.caught_up = False  # read once to the end the topic had when it was followed

    async def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="global-shard")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        shard, self.store.global_shard = self.store.global_shard, None
        if shard is not None:
            await asyncio.to_thread(shard.close)
            self.files.write_checkpoint(self.NAME, {self.topic: self.offset}, self.clock())

    async def _run(self) -> None:
        start = self.files.checkpoint(self.NAME, self.clock(), [self.topic])
        if start is None:
            self.files.wipe(self.NAME)
        self.files.drop_checkpoint(self.NAME)
        shard = await asyncio.to_thread(self.open_shard, self.files.path(self.NAME))
        self.offset = (start or {}).get(self.topic, 0)
        self.store.global_filled = self.offset > 0  # nothing folded yet: not asked
        self.store.global_shard = shard
        positions = {TopicPartition(self.topic, 0): self.offset}
        while True:
            try:
                opener = await self.opener()

                async def handle(records: list[Record], opener: Any = opener) -> None:
                    job = Restore(shard, opener, empty=False)
                    await asyncio.to_thread(job.on_changes, records)
                    self.offset = records[-1].offset + 1
                    self.store.global_filled = True

                def caught_up() -> None:
                    self.caught_up = True

                await follow(self.settings, self.topic, handle, positions=positions,
                             caught_up=caught_up)
                await asyncio.sleep(2.0)  # the topic does not exist yet
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("global shard: %s; following again in 2 s", describe(exc))
                await asyncio.sleep(2.0)
